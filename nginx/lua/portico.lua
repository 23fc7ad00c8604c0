-- Portico's Lua module for nginx. The agent writes it beside nginx.conf, which
-- loads it in init_by_lua (require "portico") and calls route, balance and
-- control from its locations.
--
-- The endpoint table: the addresses behind every upstream name, kept
-- out of nginx.conf so that an endpoint change needs no reload. The agent
-- writes it to a file that load reads into the shared dictionary whenever
-- a master starts or reloads, and PUTs it to the control socket for live
-- changes.
--
-- Format: a header "# portico endpoints <version>", then one line per
-- upstream: its name and its endpoints ("10.0.0.1:80", "[fd00::1]:80").
--
-- The liveness verdicts: which replicas this node's agent calls down, one
-- line each ("down 10.0.0.3"). The liveness server answers them to every
-- director's probe, so that a replica the others call down learns it from
-- their answers and calls itself down too: every edge's rings then agree
-- (package liveness). They live in the same dictionary, and an nginx that has
-- none (just started) answers "live" alone, which calls nobody down.
local balancer = require "ngx.balancer"
local byte, sub, find, match, gmatch = string.byte, string.sub, string.find, string.match, string.gmatch

local M = {}
local dict = ngx.shared.portico_endpoints
local max_tries = 3 -- proxy_next_upstream_tries
local version -- the version of this worker's table
local by_name = {} -- that table: endpoint lists by upstream name
local next_index = {} -- round-robin position by upstream name

-- The parser scans bytes with plain finds, which LuaJIT compiles; the
-- pattern functions would run interpreted. Each function reads s[i..j].

-- An upstream name: [a-z0-9][a-z0-9.-]*.
local function valid_name(s, i, j)
    if j < i then
        return false
    end
    for k = i, j do
        local c = byte(s, k)
        if not (c >= 97 and c <= 122 or c >= 48 and c <= 57 or k > i and (c == 45 or c == 46)) then
            return false
        end
    end
    return true
end

-- An endpoint: "10.0.0.1:80" or "[fd00::1]:80"; returns host and port.
local function parse_endpoint(s, i, j)
    local colon
    for k = j, i, -1 do
        if byte(s, k) == 58 then
            colon = k
            break
        end
    end
    if not colon or colon == j or j - colon > 5 then
        return nil
    end
    local port = 0
    for k = colon + 1, j do
        local c = byte(s, k)
        if c < 48 or c > 57 then
            return nil
        end
        port = port * 10 + c - 48
    end
    if port < 1 or port > 65535 then
        return nil
    end
    if byte(s, i) == 91 then -- '[': IPv6 in brackets
        if colon - i < 3 or byte(s, colon - 1) ~= 93 then
            return nil
        end
        for k = i + 1, colon - 2 do
            local c = byte(s, k)
            if not (c >= 48 and c <= 58 or c >= 97 and c <= 102 or c >= 65 and c <= 70 or c == 46) then
                return nil
            end
        end
    else
        if colon == i then
            return nil
        end
        for k = i, colon - 1 do
            local c = byte(s, k)
            if not (c >= 48 and c <= 57 or c == 46) then
                return nil
            end
        end
    end
    return sub(s, i, colon - 1), port
end

-- An upstream line: its name and its endpoints, separated by one space.
local function parse_line(s, i, j)
    local sp = find(s, " ", i, true)
    local name_end = (sp and sp <= j) and sp - 1 or j
    if not valid_name(s, i, name_end) then
        return nil, "bad upstream line: " .. sub(s, i, math.min(j, i + 79))
    end
    local list = {}
    local p = name_end + 1 -- at a space, or past the line
    while p <= j do
        local q = find(s, " ", p + 1, true)
        local e = (q and q <= j) and q - 1 or j
        local host, port = parse_endpoint(s, p + 1, e)
        if not host then
            return nil, "bad endpoint of " .. sub(s, i, name_end) .. ": " .. sub(s, p + 1, math.min(e, p + 80))
        end
        list[#list + 1] = { host, port }
        p = e + 1
    end
    return sub(s, i, name_end), list
end

-- check reads a whole table and returns its version; with into, it also
-- fills into with every upstream's endpoint list, by name.
local function check(s, into)
    local nl = find(s, "\n", 1, true)
    local ver = nl and match(sub(s, 1, nl - 1), "^# portico endpoints (%x+)$")
    if not ver then
        return nil, "no endpoint table header"
    end
    local p, n = nl + 1, #s
    while p <= n do
        local e = find(s, "\n", p, true)
        if not e then
            return nil, "the last line does not end"
        end
        local name, list = parse_line(s, p, e - 1)
        if not name then
            return nil, list
        end
        if into then
            into[name] = list
        end
        p = e + 1
    end
    return ver
end

-- store checks a table and makes it the current one. The version goes
-- last: a worker that sees it finds this table or a newer one.
local function store(s)
    local ver, err = check(s)
    if not ver then
        return nil, err
    end
    local ok
    ok, err = dict:safe_set("table", s)
    if not ok then
        return nil, "store endpoint table: " .. err
    end
    ok, err = dict:safe_set("version", ver)
    if not ok then
        return nil, "store endpoint table version: " .. err
    end
    return ver
end

-- load runs in the master (init_by_lua) at every start and reload.
function M.load(path)
    if byte(path, 1) ~= 47 then -- relative to the prefix, like nginx's paths
        path = ngx.config.prefix() .. path
    end
    local f, err = io.open(path, "rb")
    if not f then
        error("portico: read endpoint table: " .. err)
    end
    local s = f:read("*a")
    f:close()
    local ver, serr = store(s)
    if not ver then
        error("portico: load endpoint table " .. path .. ": " .. serr)
    end
end

-- endpoints returns an upstream's endpoints from the current table (nil
-- for a name it does not have). When the version changes, a worker
-- parses the whole table once, in one pass, into its own map.
local function endpoints(name)
    local ver = dict:get("version")
    if ver ~= version then
        local s = dict:get("table")
        if not s then
            return nil
        end
        -- The table may be newer than ver (store sets it first): its
        -- own version is the one to compare with from now on.
        local m = {}
        local v, err = check(s, m)
        if not v then -- store checked it: not expected
            ngx.log(ngx.ERR, "portico: endpoint table ", ver, ": ", err)
        end
        version, by_name = v or ver, m
    end
    return by_name[name]
end

-- id names an endpoint in an affinity cookie: derived from its address
-- alone, so every replica's nginx reads a cookie the same way. Computed
-- once per endpoint and table.
local function id(peer)
    local v = peer[3]
    if not v then
        v = sub(ngx.md5(peer[1] .. ":" .. peer[2]), 1, 16)
        peer[3] = v
    end
    return v
end

-- cookie returns the value of the request's cookie called name.
local function cookie(name)
    local h = ngx.var.http_cookie
    if not h then
        return nil
    end
    for k, v in gmatch(h, "%s*([^=;%s]+)=([^;]*)") do
        if k == name then
            return v
        end
    end
    return nil
end

-- route runs at the end of every request's rewrite phase: a location that
-- proxies names its upstream in $portico_upstream; one without endpoints
-- answers 503. A location with cookie affinity follows the name with its
-- cookie's name, path and max-age, if any ("up cookie /path 600"): the
-- endpoint the request's cookie names, when the upstream still has it, is the
-- one balance tries first.
function M.route()
    local name = ngx.var.portico_upstream
    if not name or name == "" then
        return
    end
    local aff
    local sp = find(name, " ", 1, true)
    if sp then
        name, aff = sub(name, 1, sp - 1), sub(name, sp + 1)
    end
    local list = endpoints(name)
    if not list or #list == 0 then
        return ngx.exit(ngx.HTTP_SERVICE_UNAVAILABLE)
    end
    local ctx = ngx.ctx
    ctx.portico_name = name
    ctx.portico_peers = list
    if aff then
        local cname, path, age = match(aff, "^(%S+) (%S+) ?(%d*)$")
        if not cname then
            ngx.log(ngx.ERR, "portico: bad affinity ", aff)
            return
        end
        ctx.portico_cookie, ctx.portico_path, ctx.portico_age = cname, path, age
        local want = cookie(cname)
        ctx.portico_had = want
        if want then
            for i = 1, #list do
                if id(list[i]) == want then
                    ctx.portico_sticky = i
                    break
                end
            end
        end
    end
end

-- balance picks the endpoint: the one the affinity cookie names, else round
-- robin per worker; and the next endpoint when nginx retries after a failed
-- connection.
function M.balance()
    local ctx = ngx.ctx
    local list = ctx.portico_peers
    if not list then
        ngx.log(ngx.ERR, "portico: no endpoint list for this request")
        return ngx.exit(ngx.ERROR)
    end
    local n = #list
    local i = ctx.portico_index
    if i then
        i = i % n + 1
    else
        i = ctx.portico_sticky
        if not i then
            local name = ctx.portico_name
            i = (next_index[name] or ngx.worker.pid()) % n + 1
            next_index[name] = i
        end
        if n > 1 then
            local ok, err = balancer.set_more_tries(math.min(n, max_tries) - 1)
            if not ok then
                ngx.log(ngx.ERR, "portico: set more tries: ", err)
            end
        end
    end
    ctx.portico_index = i
    local peer = list[i]
    local ok, err = balancer.set_current_peer(peer[1], peer[2])
    if not ok then
        ngx.log(ngx.ERR, "portico: set peer ", peer[1], ":", peer[2], ": ", err)
        return ngx.exit(ngx.ERROR)
    end
end

-- stick runs in every response's header filter: when the request had cookie
-- affinity and the endpoint that answered is not the one its cookie named
-- (none yet, one that left, or one that failed), the response sets the cookie
-- to it, beside any cookie the upstream set.
function M.stick()
    local ctx = ngx.ctx
    local cname = ctx.portico_cookie
    local i = ctx.portico_index
    if not cname or not i then
        return
    end
    local v = id(ctx.portico_peers[i])
    if v == ctx.portico_had then
        return
    end
    local c = cname .. "=" .. v .. "; Path=" .. ctx.portico_path .. "; HttpOnly"
    local age = ctx.portico_age
    if age ~= "" then
        c = c .. "; Max-Age=" .. age
    end
    local h = ngx.header["Set-Cookie"]
    if h == nil then
        ngx.header["Set-Cookie"] = c
    elseif type(h) == "table" then
        h[#h + 1] = c
        ngx.header["Set-Cookie"] = h
    else
        ngx.header["Set-Cookie"] = { h, c }
    end
end

-- put_body returns a control request's body ("" for none); for a GET it
-- calls get (which answers) and returns nil, for another method other than
-- PUT it answers 405 and returns nil.
local function put_body(get)
    local method = ngx.req.get_method()
    if method == "GET" then
        get()
        return nil
    end
    if method ~= "PUT" then
        ngx.exit(ngx.HTTP_NOT_ALLOWED)
        return nil
    end
    ngx.req.read_body()
    return ngx.req.get_body_data() or ""
end

-- control serves the control socket: GET answers the version in use, PUT
-- replaces the table.
function M.control()
    local text = put_body(function() ngx.say(dict:get("version") or "") end)
    if not text then
        return
    end
    if text == "" then
        ngx.status = ngx.HTTP_BAD_REQUEST
        ngx.say("no body")
        return
    end
    local ver, err = store(text)
    if not ver then
        ngx.status = ngx.HTTP_BAD_REQUEST
        ngx.say(err)
        return
    end
    ngx.say(ver)
end

-- verdict_line is one line of the verdicts: "down " and an address.
local function verdict_line(s, i, j)
    if j - i < 6 or j - i > 60 or sub(s, i, i + 4) ~= "down " then
        return false
    end
    for k = i + 5, j do
        local c = byte(s, k)
        -- digits, a-f, A-F, ':' and '.'
        if not ((c >= 48 and c <= 58) or (c >= 97 and c <= 102) or (c >= 65 and c <= 70) or c == 46) then
            return false
        end
    end
    return true
end

-- verdicts serves the control socket's /verdicts: GET answers them, PUT
-- replaces them (each line checked; at most 64 KiB).
function M.verdicts()
    local text = put_body(function() ngx.print(dict:get("verdicts") or "") end)
    if not text then
        return
    end
    if #text > 65536 then
        ngx.status = ngx.HTTP_BAD_REQUEST
        ngx.say("verdicts: longer than 64 KiB")
        return
    end
    local p = 1
    while p <= #text do
        local e = find(text, "\n", p, true)
        if not e or not verdict_line(text, p, e - 1) then
            ngx.status = ngx.HTTP_BAD_REQUEST
            ngx.say("verdicts: bad line at byte ", p)
            return
        end
        p = e + 1
    end
    local ok, err = dict:safe_set("verdicts", text)
    if not ok then
        ngx.status = ngx.HTTP_INTERNAL_SERVER_ERROR
        ngx.say("store verdicts: ", err)
        return
    end
    ngx.say("ok")
end

-- live answers a director's liveness probe: this nginx serves, and which
-- replicas this node's agent calls down.
function M.live()
    ngx.print("live\n", dict:get("verdicts") or "")
end

return M
