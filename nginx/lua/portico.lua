-- Portico's Lua module for nginx. The agent writes it beside nginx.conf, which
-- loads it in init_by_lua (require "portico") and calls certificate, route,
-- balance and stick from its one HTTP server, and control from its control
-- socket.
--
-- The table: everything a configuration change touches, kept out of
-- nginx.conf so that no such change needs a reload. It is a set of keys and
-- values in the shared dictionary:
--   "h:<host>"  a host's routes ("h:" is the catch-all, always present);
--   "h:<n>/<host>" the same for view n (one port of a Gateway's own VIPs;
--               "h:<n>/" its catch-all, always present), "w:<n>/" its "w:";
--   "a:"        the views' VIPs and ports, "<address>|<hex of its
--               bytes>|<port>=<n>/" each: a request to one of them is routed
--               by its view's hosts alone, any other request by the hosts of
--               no view;
--   "u:<name>"  an upstream's endpoints ("10.0.0.1:80 [fd00::1]:80");
--   "c:<id>"    a certificate chain and its key, PEM with "!" for newlines;
--   "w:"        the label counts of the suffixes of "h:**.<suffix>" hosts
--               (wildcards of any depth, Gateway API's), most first.
-- A host's routes: its certificate's id or "-" (in a view, followed by "~"
-- and the name of the Gateway listener whose host it is), the HTTPS port to redirect
-- plain HTTP to or "-", a status to answer every request with or "-", then
-- pairs of a match and a target. A match is "=/path" (exact) or a prefix
-- ending in "/"; a match given more than once is a chain of candidates, which
-- a request tries in order (see route). A target is "@<status>", an upstream
-- name, "<upstream>|<cookie>|<path>|<max-age>" for cookie affinity, or
-- weighted backends "<upstream or @status>*<weight>,..." (each weight may be
-- followed by the backend's own request headers, "!s=...", "!a=...", "!d=...");
-- then options, each
-- ";<key>=<value>" with the value %-escaped: conditions (m a method, h a
-- header and q a query parameter "<name>:<value>"), request headers set (s),
-- appended to (a) and removed (d), the same for the response (S, A, D), a
-- redirect (r, empty) and its scheme, host, port, full path and prefix (rs,
-- rh, rp, rf, rx; the status is the target's), a rewrite's host, full path
-- and prefix (wh, wf, wx), the length of the prefix a replaced prefix is
-- (pl), the request and backend timeouts in milliseconds (tr, tb), a CORS
-- filter's origins, methods, headers, exposed headers, max age and
-- credentials (co, cm, ch, ce, ca, cc), and each mirror's upstream and share
-- (mi, "<upstream>*<numerator>/<denominator>");
-- last "#<namespace>/<name>" of the object that asked for the route when
-- there is one (the telemetry's ingress label).
--
-- The agent writes the whole table to a file that load reads whenever a
-- master starts or reloads, and PUTs each change to the control socket as a
-- delta: "# portico delta <base> <digest>", then "set <key> <value>" and
-- "del <key>" lines. A delta applies only to the table whose digest is its
-- base (else 409: the agent then reloads, which loads the file). Every
-- change gets a version number and a log entry naming the keys it touched;
-- a worker that sees a new version forgets only those keys from its cache
-- of parsed values, so a change costs each worker the keys it changed, not
-- the size of the table.
--
-- The liveness verdicts: which replicas this node's agent calls down, one
-- line each ("down 10.0.0.3"). The liveness server answers them to every
-- director's probe, so that a replica the others call down learns it from
-- their answers and calls itself down too: every edge's rings then agree
-- (package liveness). They live in the same dictionary, and an nginx that has
-- none (just started) answers "live" alone, which calls nobody down.
local ffi = require "ffi"
local balancer = require "ngx.balancer"
local ssl = require "ngx.ssl"
local byte, sub, find, match, gmatch, gsub, lower = string.byte, string.sub, string.find, string.match, string.gmatch, string.gsub, string.lower

local M = {}
local dict = ngx.shared.portico
local tdict = ngx.shared.portico_telemetry -- nil without telemetry
local max_tries = 3 -- proxy_next_upstream_tries
local log_keep = 256 -- versions whose log entries stay in the dictionary
local seen = 0 -- the version this worker's cache is at
local cache = {} -- parsed values by key; false for a key the table lacks
local next_index = {} -- round-robin position by upstream name
local log_sample = false -- the share of requests the access log writes (configure); false: no log
local counting = false -- stick counts every response (configure)
local count -- the telemetry's, below

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


-- A key: "h:" and a host (after a view's "<n>/"), "u:" and an upstream
-- name, "c:" and a certificate id, "w:" (after a view's "<n>/"), or "a:"; at
-- most 260 bytes of [a-z0-9.*_-/].
local function valid_key(s, i, j)
    if j - i < 1 or j - i > 259 or byte(s, i + 1) ~= 58 then
        return false
    end
    local kind = byte(s, i)
    if kind ~= 104 and kind ~= 117 and kind ~= 99 and kind ~= 119 and kind ~= 97 then -- h, u, c, w, a
        return false
    end
    local empty = j < i + 2
    if kind == 97 then -- "a:" has no name
        return empty
    elseif kind == 119 then -- "w:" has a view's prefix or nothing
        if not empty and not find(sub(s, i + 2, j), "^%d+/$") then
            return false
        end
    elseif empty and kind ~= 104 then -- only hosts have an empty one
        return false
    end
    for k = i + 2, j do
        local c = byte(s, k)
        if not (c >= 97 and c <= 122 or c >= 48 and c <= 57 or c == 45 or c == 46 or c == 42 or c == 95 or c == 47 and kind ~= 117) then
            return false
        end
    end
    return true
end

-- A value: printable ASCII without control characters, at most 8 MiB.
local function valid_value(s, i, j)
    if j - i >= 8388608 then
        return false
    end
    return not find(sub(s, i, j), "[%c\127-\255]")
end

-- parse_delta checks a delta and returns its records ({key, value or
-- false}), its base, its digest and its stamp (when the agent made it, in
-- microseconds); or nil and why.
local function parse_delta(s)
    local nl = find(s, "\n", 1, true)
    local base, digest, stamp
    if nl then
        base, digest, stamp = match(sub(s, 1, nl - 1), "^# portico delta (%x*) (%x+) (%d+)$")
    end
    if not digest then
        return nil, "no delta header"
    end
    local recs = {}
    local p, n = nl + 1, #s
    while p <= n do
        local e = find(s, "\n", p, true)
        if not e then
            return nil, "the last line does not end"
        end
        local op = sub(s, p, p + 3)
        local ks = p + 4
        local sp = find(s, " ", ks, true)
        local ke = (sp and sp < e) and sp - 1 or e - 1
        if not valid_key(s, ks, ke) then
            return nil, "bad key at byte " .. p
        end
        if op == "set " then
            local v = "" -- an upstream without endpoints
            if ke + 1 < e then
                if not valid_value(s, ke + 2, e - 1) then
                    return nil, "bad value at byte " .. p
                end
                v = sub(s, ke + 2, e - 1)
            end
            recs[#recs + 1] = { sub(s, ks, ke), v }
        elseif op == "del " and ke == e - 1 then
            recs[#recs + 1] = { sub(s, ks, ke), false }
        else
            return nil, "bad record at byte " .. p
        end
        p = e + 1
    end
    return recs, base, digest, tonumber(stamp)
end

-- commit writes records and a new version whose log names their keys
-- ("*" when every key may have changed). The version goes last: a worker
-- that sees it finds these values or newer ones. (Deletions go first too: a
-- key deleted after the version would be read back into a worker's cache,
-- which nothing would clear.) A commit that fails half way drops the
-- digest, so that the agent's next delta is refused and it reloads nginx
-- with the whole table: a set that fails for want of room may already have
-- freed the old value.
local function commit(recs, digest, stamp, all)
    local function failed(what, err)
        dict:delete("digest")
        return nil, what .. ": " .. tostring(err)
    end
    local keys = {}
    for i = 1, #recs do
        local r = recs[i]
        if r[2] then
            local ok, err = dict:safe_set("k:" .. r[1], r[2])
            if not ok then
                return failed("store " .. r[1], err)
            end
        else
            dict:delete("k:" .. r[1])
        end
        keys[#keys + 1] = r[1]
    end
    local v = (dict:get("version") or 0) + 1
    local ok, err = dict:safe_set("log:" .. v, all and "*" or table.concat(keys, " "))
    if not ok then
        return failed("store log", err)
    end
    dict:delete("log:" .. (v - log_keep))
    ok, err = dict:safe_set("digest", digest)
    if ok then
        ok, err = dict:safe_set("stamp", stamp)
    end
    if not ok then
        return failed("store digest", err)
    end
    dict:set("version", v)
    return v
end

-- load runs in the master (init_by_lua) at every start and reload: the
-- file is the whole table (a delta from nothing), which replaces the
-- dictionary's, keys it lacks included.
function M.load(path)
    if byte(path, 1) ~= 47 then -- relative to the prefix, like nginx's paths
        path = ngx.config.prefix() .. path
    end
    local f, err = io.open(path, "rb")
    if not f then
        error("portico: read table: " .. err)
    end
    local s = f:read("*a")
    f:close()
    local recs, err2, digest, stamp = parse_delta(s)
    if not recs then
        -- nginx serves what the dictionary has (nothing, at a first start)
        -- rather than not at all; the agent sees the digest it did not get.
        ngx.log(ngx.ERR, "portico: load table ", path, ": ", err2, ": kept the table in use")
        return
    end
    local have = dict:get("stamp")
    if have and stamp < have then
        -- Someone else reloaded nginx (the agent writes the file before its
        -- own reloads): the changes the dictionary got since the file was
        -- written must not be undone.
        ngx.log(ngx.NOTICE, "portico: ", path, " is older than the table in use: kept the table")
        return
    end
    local want = {}
    for i = 1, #recs do
        want[recs[i][1]] = true
    end
    for _, k in ipairs(dict:get_keys(0)) do
        if sub(k, 1, 2) == "k:" and not want[sub(k, 3)] then
            recs[#recs + 1] = { sub(k, 3), false }
        end
    end
    local ok, cerr = commit(recs, digest, stamp, true)
    if not ok then
        ngx.log(ngx.ERR, "portico: load table ", path, ": ", cerr)
    end
end

-- sync brings this worker's cache to the dictionary's version: it forgets
-- the keys every newer log entry names, or everything when an entry says
-- "*" or is gone.
local function sync()
    local v = dict:get("version") or 0
    if v == seen then
        return
    end
    if v < seen or v - seen > log_keep then
        cache = {}
    else
        for i = seen + 1, v do
            local l = dict:get("log:" .. i)
            if not l or l == "*" then
                cache = {}
                break
            end
            for k in gmatch(l, "%S+") do
                cache[k] = nil
            end
        end
    end
    seen = v
end

-- parse_endpoints reads an upstream's value: endpoints separated by spaces.
local function parse_endpoints(s)
    local list = {}
    local p, n = 1, #s
    while p <= n do
        local q = find(s, " ", p, true)
        local e = q and q - 1 or n
        local host, port = parse_endpoint(s, p, e)
        if not host then
            return nil, "bad endpoint " .. sub(s, p, math.min(e, p + 80))
        end
        list[#list + 1] = { host, port }
        p = e + 2
    end
    return list
end

-- valid_source is an Ingress's "namespace/name": [a-z0-9.-] on each side.
local function valid_source(s)
    local slash = find(s, "/", 1, true)
    return slash and slash > 1 and slash < #s and valid_name(s, 1, slash - 1) and valid_name(s, slash + 1, #s)
end

-- parse_status reads "@<status>" (200-599).
local function parse_status(s)
    local st = tonumber(sub(s, 2))
    if not st or st < 200 or st > 599 or st % 1 ~= 0 then
        return nil
    end
    return st
end

-- header_var is the nginx variable that reads a request header, or nil when
-- the name has characters no variable's name takes.
local function header_var(name)
    if find(name, "^[a-z0-9-]+$") then
        return "http_" .. gsub(name, "-", "_")
    end
    return nil
end

-- parse_options reads a target's options (";k=v;k=v") into its conditions
-- (t.c) and filters (t.f); false when one does not parse.
local function parse_options(t, s)
    local c, f
    for k, v in gmatch(s, ";([%a]+)=([^;]*)") do
        local name, val = match(v, "^([^:]*):(.*)$")
        if name then
            name, val = ngx.unescape_uri(name), ngx.unescape_uri(val)
        end
        v = ngx.unescape_uri(v)
        if k == "m" then
            c = c or {}
            c.method = v
        elseif k == "h" or k == "q" then
            if not name or name == "" then
                return false
            end
            c = c or {}
            local list = k == "h" and "h" or "q"
            c[list] = c[list] or {}
            c[list][#c[list] + 1] = { name, val, k == "h" and header_var(name) or nil }
        elseif k == "s" or k == "a" or k == "S" or k == "A" then
            if not name or name == "" then
                return false
            end
            f = f or {}
            f[k] = f[k] or {}
            f[k][#f[k] + 1] = { name, val }
        elseif k == "d" or k == "D" then
            f = f or {}
            f[k] = f[k] or {}
            f[k][#f[k] + 1] = v
        elseif k == "r" then
            f = f or {}
            f.r = true
        elseif k == "rp" or k == "pl" or k == "tr" or k == "tb" then
            f = f or {}
            f[k] = tonumber(v)
            if not f[k] or f[k] < 0 or f[k] > 86400000 then
                return false
            end
        elseif k == "rs" or k == "rh" or k == "rf" or k == "rx" or k == "wh" or k == "wf" or k == "wx" then
            f = f or {}
            f[k] = v
        elseif k == "mi" then
            local up, num, den = match(v, "^([^*]+)%*(%d+)/(%d+)$")
            num, den = tonumber(num), tonumber(den)
            if not up or not valid_name(up, 1, #up) or not num or not den or den > 0 and num > den then
                return false
            end
            f = f or {}
            f.mirrors = f.mirrors or {}
            f.mirrors[#f.mirrors + 1] = { up = up, num = num, den = den }
        elseif k == "co" or k == "cm" or k == "ch" or k == "ce" or k == "ca" or k == "cc" then
            f = f or {}
            local cors = f.cors or { co = {}, cm = {}, ch = {}, ce = {} }
            f.cors = cors
            if k == "ca" then
                cors.ca = tonumber(v) and v
                if not cors.ca then
                    return false
                end
            elseif k == "cc" then
                cors.cc = true
            else
                local l = cors[k]
                l[#l + 1] = v
            end
        else
            return false
        end
    end
    t.c, t.f = c, f
    if f then
        f.redirect = f.r
        f.req = f.s or f.a or f.d or f.wh or f.wf or f.wx
        f.resp = f.S or f.A or f.D
        local cors = f.cors
        if cors then
            -- What the answers carry, joined once; "*" echoes the preflight's.
            cors.methods = table.concat(cors.cm, ", ")
            cors.headers = #cors.ch > 0 and table.concat(cors.ch, ", ") or nil
            cors.expose = #cors.ce > 0 and table.concat(cors.ce, ", ") or nil
            cors.anymethod = cors.methods == "*" or find(cors.methods, "*", 1, true) ~= nil
            cors.anyheader = cors.headers ~= nil and find(cors.headers, "*", 1, true) ~= nil
        end
    end
    return true
end

-- cors_allows reports whether a CORS filter allows origin: "*", the same
-- origin, or "scheme://*.suffix" and a host of any labels before the suffix.
local function cors_allows(cors, origin)
    local list = cors.co
    for i = 1, #list do
        local o = list[i]
        if o == "*" or o == origin then
            return true
        end
        local scheme, suffix = match(o, "^([^:]+)://%*(%..+)$")
        if scheme then
            local s, host = match(origin, "^([^:]+)://(.+)$")
            if s == scheme and #host > #suffix and sub(host, -#suffix) == suffix then
                return true
            end
        end
    end
    return false
end

-- cors_answer gives an answer to a request from origin the headers of every
-- CORS answer, when the filter allows the origin; it returns the headers (nil
-- when it does not allow it).
local function cors_answer(cors, origin)
    if not cors_allows(cors, origin) then
        return nil
    end
    local h = ngx.header
    h["Access-Control-Allow-Origin"] = origin
    h["Access-Control-Expose-Headers"] = cors.expose
    if cors.cc then
        h["Access-Control-Allow-Credentials"] = "true"
    end
    h["Vary"] = "Origin"
    return h
end

-- preflight answers a CORS preflight request itself: 204, with the
-- Access-Control-Allow-* headers when the filter allows its origin.
local function preflight(cors, origin)
    local h = cors_answer(cors, origin)
    if h then
        local var = ngx.var
        h["Access-Control-Allow-Methods"] = cors.anymethod and var.http_access_control_request_method or cors.methods
        if cors.anyheader then
            h["Access-Control-Allow-Headers"] = var.http_access_control_request_headers
        elseif cors.headers then
            h["Access-Control-Allow-Headers"] = cors.headers
        end
        h["Access-Control-Max-Age"] = cors.ca
    end
    ngx.status = 204
    ngx.send_headers()
    return ngx.exit(ngx.HTTP_OK)
end

-- parse_weighted reads weighted backends ("up*3,@500*1") into a list of
-- targets (each with its weight, w, and cw, the smooth round robin's
-- current weight) and their total weight.
local function parse_weighted(s, src)
    local list, total = {}, 0
    for item in gmatch(s, "[^,]+") do
        -- A backend's own request headers follow its weight: "!k=v", the
        -- options' form with '!' for ';'.
        local own
        local bang = find(item, "!", 1, true)
        if bang then
            own = gsub(sub(item, bang), "!", ";")
            item = sub(item, 1, bang - 1)
        end
        local name, w = match(item, "^([^*]+)%*(%d+)$")
        w = tonumber(w)
        if not name or not w or w < 1 or w > 1000000 then
            return nil
        end
        local t
        if byte(name, 1) == 64 then -- '@'
            local st = parse_status(name)
            if not st then
                return nil
            end
            t = { status = st, src = src, w = w, cw = 0 }
        elseif valid_name(name, 1, #name) then
            t = { up = name, src = src, w = w, cw = 0 }
        else
            return nil
        end
        if own then
            -- parse_options fills c and f; a backend has f alone, kept as bf.
            local o = {}
            if not parse_options(o, own) or o.c or not o.f or o.f.redirect or o.f.resp then
                return nil
            end
            t.bf = o.f
        end
        list[#list + 1] = t
        total = total + w
    end
    if #list == 0 then
        return nil
    end
    return list, total
end

-- parse_target reads a route's target (see the top of this file).
local function parse_target(s)
    local src
    local hash = find(s, "#", 1, true)
    if hash then
        src = sub(s, hash + 1)
        if not valid_source(src) then
            return nil
        end
        s = sub(s, 1, hash - 1)
    end
    local semi = find(s, ";", 1, true)
    if semi then
        local t = parse_target(sub(s, 1, semi - 1))
        if not t or not parse_options(t, sub(s, semi)) then
            return nil
        end
        t.src = src
        if t.ws then
            for i = 1, #t.ws do
                t.ws[i].src, t.ws[i].f = src, t.f
            end
        end
        return t
    end
    if find(s, "*", 1, true) then
        local ws, total = parse_weighted(s, src)
        if not ws then
            return nil
        end
        return { ws = ws, total = total, src = src }
    end
    if byte(s, 1) == 64 then -- '@'
        local st = parse_status(s)
        if not st then
            return nil
        end
        return { status = st, src = src }
    end
    local up, cname, path, age = match(s, "^([^|]+)|([^|]+)|([^|]+)|(%d*)$")
    if up then
        if not valid_name(up, 1, #up) then
            return nil
        end
        return { up = up, cookie = cname, path = path, age = age, src = src }
    end
    if not valid_name(s, 1, #s) then
        return nil
    end
    return { up = s, src = src }
end

-- parse_host reads a host's routes (see the top of this file).
local function parse_host(s)
    local f = {}
    for w in gmatch(s, "%S+") do
        f[#f + 1] = w
    end
    if #f < 3 or #f % 2 == 0 then
        return nil, "bad host entry"
    end
    local e = { exact = {}, prefix = {}, longest = 1 }
    local cert, listener = match(f[1], "^([^~]+)~([%w-]+)$")
    if cert then
        f[1], e.listener = cert, listener
    end
    if f[1] ~= "-" then
        e.cert = f[1]
    end
    if f[2] ~= "-" then
        local port = tonumber(f[2])
        if not port then
            return nil, "bad redirect port"
        end
        e.redirect = port == 443 and "" or ":" .. port
    end
    if f[3] ~= "-" then
        e.status = tonumber(f[3])
        if not e.status then
            return nil, "bad status"
        end
    end
    for i = 4, #f, 2 do
        local m, t = f[i], parse_target(f[i + 1])
        if not t or byte(m, 1) ~= 47 and byte(m, 1) ~= 61 then
            return nil, "bad route " .. m
        end
        local set
        if byte(m, 1) == 61 then -- '='
            set, m = e.exact, sub(m, 2)
        elseif byte(m, #m) == 47 then
            set = e.prefix
            if #m > e.longest then
                e.longest = #m
            end
        else
            return nil, "bad prefix " .. m
        end
        -- A match given again is the next candidate of its chain.
        local last = set[m]
        if not last then
            set[m] = t
        else
            while last.nxt do
                last = last.nxt
            end
            last.nxt = t
            set[m].chain = true
        end
        if t.c or t.ws or t.f then
            set[m].chain = true
        end
    end
    return e
end

-- parse_depths reads "w:": label counts, most first.
local function parse_depths(s)
    local list = {}
    for w in gmatch(s, "%S+") do
        local n = tonumber(w)
        if not n or n < 1 or n > 127 then
            return nil, "bad depth " .. w
        end
        list[#list + 1] = n
    end
    table.sort(list, function(a, b) return a > b end)
    return list
end

-- parse_views reads "a:": each view's VIPs, by their text (nginx's
-- $server_addr) and by their bytes (ngx.ssl's raw_server_addr), then by
-- port (a number and its text), to its prefix.
local function parse_views(s)
    local m = {}
    for text, hex, port, p in gmatch(s, "([^%s|]+)|(%x+)|(%d+)=(%d+/)") do
        local n = tonumber(port)
        if #hex ~= 8 and #hex ~= 32 or n < 1 or n > 65535 then
            return nil, "bad address " .. text .. " port " .. port
        end
        local ports = m[text]
        if not ports then
            ports = {}
            m[text] = ports
            m[gsub(hex, "%x%x", function(h) return string.char(tonumber(h, 16)) end)] = ports
        end
        ports[port], ports[n] = p, p
    end
    return m
end

-- pem_lines turns a stored certificate back into PEM.
local function pem_lines(s)
    return (gsub(s, "!", "\n"))
end

-- parse_cert reads a certificate value into OpenSSL's objects.
local function parse_cert(s)
    local pem = pem_lines(s)
    local chain, err = ssl.parse_pem_cert(pem)
    if not chain then
        return nil, "certificate: " .. err
    end
    local key
    key, err = ssl.parse_pem_priv_key(pem)
    if not key then
        return nil, "key: " .. err
    end
    return { chain = chain, key = key }
end

local parsers = { [104] = parse_host, [117] = parse_endpoints, [99] = parse_cert, [119] = parse_depths, [97] = parse_views }

-- get returns a key's parsed value (nil when the table lacks it or it does
-- not parse), from this worker's cache when the key did not change since. A
-- key the table lacks is not cached: clients choose the hosts they ask for,
-- and the cache holds no more than the table.
local function get(key)
    local v = cache[key]
    if v == nil then
        local s = dict:get("k:" .. key)
        if not s then
            return nil
        end
        local err
        v, err = parsers[byte(key, 1)](s)
        if not v then
            ngx.log(ngx.ERR, "portico: ", key, ": ", err)
        end
        cache[key] = v or false
    end
    return v or nil
end

-- view is the prefix of the view whose VIP and port a connection came to
-- ("" for none), addr and port telling them: nothing is asked of the
-- connection when the table has no view (an Ingress-only edge pays one
-- cached lookup).
local function view(addr, port)
    local m = cache["a:"]
    if m == nil then
        m = get("a:") or false
        cache["a:"] = m -- the table lacking it too: a change to it is forgotten
    end
    if not m then
        return ""
    end
    local ports = m[addr()]
    return ports and ports[port()] or ""
end

-- The address and port of the request's connection, for view.
local function server_addr() return ngx.var.server_addr end
local function server_port() return ngx.var.server_port end
-- raw_server_addr first: on a wildcard listener it asks the socket for the
-- address the client came to, which server_port then reads.
local function tls_server_addr() return (ssl.raw_server_addr()) end
local function tls_server_port() return ssl.server_port() end

-- entry returns the routes of host in view v (its prefix; exact name
-- first, then the wildcard one label up), those of a host with a certificate
-- when tls is set; nil when there are none.
local function entry(v, host, tls)
    local e = get("h:" .. v .. host)
    if e and (not tls or e.cert) then
        return e
    end
    local dot = find(host, ".", 1, true)
    if not dot or dot == 1 then
        return nil
    end
    e = get("h:" .. v .. "*" .. sub(host, dot))
    if e and (not tls or e.cert) then
        return e
    end
    -- Wildcards of any depth ("h:**.<suffix>"), the longest suffix first:
    -- one key per depth the table has, whatever the host's length.
    local depths = #host <= 253 and get("w:" .. v)
    if not depths then
        return nil
    end
    for i = 1, #depths do
        local d, k = depths[i], #host
        while k > 0 do
            if byte(host, k) == 46 then
                d = d - 1
                if d == 0 then
                    break
                end
            end
            k = k - 1
        end
        if k > 1 then
            e = get("h:" .. v .. "**" .. sub(host, k))
            if e and (not tls or e.cert) then
                return e
            end
        end
    end
    return nil
end

-- certificate runs in every TLS handshake (ssl_certificate_by_lua): the
-- certificate of the host the client names, else the catch-all's, else the
-- handshake is refused, as nginx's ssl_reject_handshake would.
function M.certificate()
    sync()
    local name = ssl.server_name()
    if name and byte(name, -1) == 46 then -- "example.com.", as nginx reads it
        name = sub(name, 1, -2)
    end
    local v = view(tls_server_addr, tls_server_port)
    -- A name with "/" could name another view's host: nginx refuses such a
    -- Host header, and the handshake gets the catch-all's certificate.
    local e = name and name ~= "" and not find(name, "/", 1, true) and entry(v, lower(name), true)
    if not e then
        e = get("h:" .. v)
        if e and not e.cert then
            e = nil
        end
    end
    local c = e and get("c:" .. e.cert)
    if not c then
        return ngx.exit(ngx.ERROR)
    end
    local ok, err = ssl.clear_certs()
    if ok then
        ok, err = ssl.set_cert(c.chain)
    end
    if ok then
        ok, err = ssl.set_priv_key(c.key)
    end
    if not ok then
        ngx.log(ngx.ERR, "portico: set certificate ", e.cert, ": ", err)
        return ngx.exit(ngx.ERROR)
    end
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


-- meets reports whether the request meets a candidate's conditions.
local function meets(c)
    local var = ngx.var
    if c.method and var.request_method ~= c.method then
        return false
    end
    local hs = c.h
    if hs then
        local all
        for i = 1, #hs do
            local h = hs[i]
            local v
            if h[3] then
                v = var[h[3]]
            else
                all = all or ngx.req.get_headers(100)
                v = all[h[1]]
            end
            if type(v) == "table" then
                v = v[1]
            end
            if v ~= h[2] then
                return false
            end
        end
    end
    local qs = c.q
    if qs then
        local args = ngx.req.get_uri_args(100)
        for i = 1, #qs do
            local v = args[qs[i][1]]
            if type(v) == "table" then
                v = v[1]
            end
            if v ~= qs[i][2] then
                return false
            end
        end
    end
    return true
end

-- pick returns the first candidate of a chain whose conditions the request
-- meets, nil when none does.
local function pick(t)
    if not t.chain then
        return t
    end
    repeat
        if not t.c or meets(t.c) then
            return t
        end
        t = t.nxt
    until not t
    return nil
end

-- weighted picks one of a target's weighted backends: smooth weighted round
-- robin, per worker.
local function weighted(t)
    local ws, best = t.ws, nil
    for i = 1, #ws do
        local w = ws[i]
        w.cw = w.cw + w.w
        if not best or w.cw > best.cw then
            best = w
        end
    end
    best.cw = best.cw - t.total
    return best
end

-- replace_prefix replaces the first n bytes of path (the prefix its route
-- matched) with p: "/foo/bar" with "/foo" replaced by "/x" is "/x/bar", by
-- "/" is "/bar".
local function replace_prefix(path, n, p)
    if byte(p, -1) == 47 then
        p = sub(p, 1, -2)
    end
    local s = p .. sub(path, n + 1)
    if s == "" then
        return "/"
    end
    if byte(s, 1) ~= 47 then
        s = "/" .. s
    end
    return s
end

-- escape_path escapes what a Location header's path may not hold raw.
local function escape_path(p)
    return (gsub(p, "[^%w%-%._~/!$&'()*+,;=:@]", function(c)
        return string.format("%%%02X", byte(c))
    end))
end

-- redirect answers a route's redirect (Gateway API's RequestRedirect): the
-- request's URL with the filter's scheme, host, port and path. A port the
-- filter does not set is its scheme's (when it sets one) or the one the
-- request came to; the scheme's default port is left out.
local function redirect(f, host, uri, https, status)
    local var = ngx.var
    local scheme = f.rs or (https and "https" or "http")
    local port = f.rp
    if not port then
        port = f.rs and (f.rs == "https" and 443 or 80) or tonumber(var.server_port)
    end
    local url = scheme .. "://" .. (f.rh or host)
    if not (scheme == "http" and port == 80 or scheme == "https" and port == 443) then
        url = url .. ":" .. port
    end
    if f.rf or f.rx then
        url = url .. escape_path(f.rf or replace_prefix(uri, f.pl or 0, f.rx))
        local args = var.args
        if args and args ~= "" then
            url = url .. "?" .. args
        end
    else
        url = url .. var.request_uri
    end
    return ngx.redirect(url, status)
end

-- add_header is a header's values with v appended (RFC 9110's list form).
local function add_header(old, v)
    if type(old) == "table" then
        old = table.concat(old, ",")
    end
    return old and old .. "," .. v or v
end

-- modify_request applies a route's request filters: headers set, appended
-- to and removed, then the rewrite's host and path.
local function modify_request(f, uri)
    local req = ngx.req
    local list = f.s
    if list then
        for i = 1, #list do
            req.set_header(list[i][1], list[i][2])
        end
    end
    list = f.a
    if list then
        local hs = req.get_headers(100)
        for i = 1, #list do
            local n = lower(list[i][1])
            local v = add_header(hs[n], list[i][2])
            hs[n] = v
            req.set_header(n, v)
        end
    end
    list = f.d
    if list then
        for i = 1, #list do
            req.clear_header(list[i])
        end
    end
    if f.wh then
        req.set_header("Host", f.wh)
    end
    if f.wf then
        req.set_uri(f.wf)
    elseif f.wx then
        req.set_uri(replace_prefix(uri, f.pl or 0, f.wx))
    end
end

-- modify_response applies a route's response header filters.
local function modify_response(f)
    local h = ngx.header
    local list = f.S
    if list then
        for i = 1, #list do
            h[list[i][1]] = list[i][2]
        end
    end
    list = f.A
    if list then
        for i = 1, #list do
            local n = list[i][1]
            local old = h[n]
            if old == nil then
                h[n] = list[i][2]
            elseif type(old) == "table" then
                old[#old + 1] = list[i][2]
                h[n] = old
            else
                h[n] = { old, list[i][2] }
            end
        end
    end
    list = f.D
    if list then
        for i = 1, #list do
            h[list[i]] = nil
        end
    end
end

-- mirror_send sends one mirrored request to peer and drops the answer (a
-- timer: the request it copies goes on without waiting).
local function mirror_send(premature, host, port, data)
    if premature then
        return
    end
    local sock = ngx.socket.tcp()
    sock:settimeouts(1000, 1000, 1000)
    local ok = sock:connect(host, port)
    if ok and sock:send(data) then
        sock:receive("*l") -- its status line; the rest is dropped with the socket
    end
    sock:close()
end

-- hop-by-hop headers a mirrored copy does not carry (it has its own framing).
local mirror_skip = { connection = true, ["keep-alive"] = true, ["transfer-encoding"] = true, ["content-length"] = true,
    upgrade = true, te = true, ["proxy-connection"] = true }

-- mirror copies the request, as it is proxied, to an endpoint of each of
-- mirrors whose share takes it: best effort, and never for a request whose
-- body nginx holds on disk (or that upgrades).
local function mirror(mirrors, rewritten)
    local data
    for i = 1, #mirrors do
        local m = mirrors[i]
        local list = (m.den == 0 or math.random(m.den) <= m.num) and get("u:" .. m.up)
        if list and #list > 0 then
            if not data then
                local req, var = ngx.req, ngx.var
                if var.http_upgrade then
                    return
                end
                req.read_body()
                local body = req.get_body_data()
                if not body and var.request_body_file then
                    return
                end
                local target = var.request_uri
                if rewritten then
                    target = escape_path(var.uri) .. (var.is_args or "") .. (var.args or "")
                end
                local parts = { req.get_method(), " ", target, " HTTP/1.1\r\n" }
                for name, v in pairs(req.get_headers(100, true)) do
                    if not mirror_skip[lower(name)] then
                        if type(v) == "table" then
                            for j = 1, #v do
                                parts[#parts + 1] = name .. ": " .. v[j] .. "\r\n"
                            end
                        else
                            parts[#parts + 1] = name .. ": " .. v .. "\r\n"
                        end
                    end
                end
                parts[#parts + 1] = "Connection: close\r\nContent-Length: " .. (body and #body or 0) .. "\r\n\r\n"
                parts[#parts + 1] = body
                data = table.concat(parts)
            end
            local peer = list[math.random(#list)]
            local host = peer[1]
            if find(host, ":", 1, true) then
                host = "[" .. host .. "]"
            end
            local ok, err = ngx.timer.at(0, mirror_send, host, peer[2], data)
            if not ok then
                ngx.log(ngx.INFO, "portico: mirror to ", m.up, " dropped: ", err)
            end
        end
    end
end

-- route runs in every request's rewrite phase. It finds the host's routes
-- (on the HTTPS port, only a host with a certificate; else the catch-all),
-- redirects plain HTTP when the host asks for it, and picks the route as
-- nginx picks a location: an exact match, else the longest prefix (every
-- prefix ends in '/', and "/" is always there). A route answers a status,
-- or names an upstream: one without endpoints answers 503. A route with
-- cookie affinity also names its cookie's name, path and max-age: the
-- endpoint the request's cookie names, when the upstream still has it, is
-- the one balance tries first.
function M.route()
    sync()
    local sampled = log_sample and (log_sample >= 1 or math.random() < log_sample)
    if sampled then
        ngx.var.portico_sampled = "1"
    end
    local host = ngx.var.host or ""
    local https = ngx.var.https == "on"
    local v = view(server_addr, server_port)
    local e = host ~= "" and entry(v, host, https) or get("h:" .. v)
    if not e then
        return ngx.exit(444)
    end
    if https and v ~= "" then
        -- In a view, a request whose host is another listener's than the
        -- name its handshake gave was sent on a connection reused across
        -- hosts (HTTP/2): 421, as Gateway API asks.
        local sni = ngx.var.ssl_server_name
        if sni and sni ~= host then
            sni = lower(sni)
            if byte(sni, -1) == 46 then
                sni = sub(sni, 1, -2)
            end
            local se = not find(sni, "/", 1, true) and entry(v, sni, true) or get("h:" .. v)
            if se ~= e and (se and se.listener) ~= e.listener then
                return ngx.exit(421)
            end
        end
    end
    if e.status then
        return ngx.exit(e.status)
    end
    if e.redirect and not https then
        return ngx.redirect("https://" .. host .. e.redirect .. ngx.var.request_uri, 308)
    end
    local uri = ngx.var.uri
    local t = e.exact[uri]
    if t then
        t = pick(t)
    end
    if not t then
        local prefix = e.prefix
        -- From the longest prefix the host has, not the URI's end: a URI of
        -- many slashes costs no more than the host's paths. A chain none of
        -- whose candidates takes the request leaves it to a shorter prefix.
        for i = math.min(#uri, e.longest), 1, -1 do
            if byte(uri, i) == 47 then
                t = prefix[sub(uri, 1, i)]
                if t then
                    t = pick(t)
                    if t then
                        break
                    end
                end
            end
        end
        if not t then
            return ngx.exit(404)
        end
    end
    if t.ws then
        t = weighted(t)
    end
    -- The route goes into the request's context whole: its Ingress (src)
    -- and upstream (up) are what balance and count read. One key, not two:
    -- a context has room for four before it must grow, and a request routed
    -- to an upstream sets exactly four (with portico_peers, portico_index
    -- and portico_sent).
    local ctx = ngx.ctx
    ctx.portico_t = t
    if sampled then
        local var = ngx.var
        var.portico_ingress = t.src or ""
        var.portico_upstream = t.up or ""
    end
    local f = t.f
    if f then
        local cors = f.cors
        if cors and ngx.var.request_method == "OPTIONS" then
            local origin = ngx.var.http_origin
            if origin and ngx.var.http_access_control_request_method then
                return preflight(cors, origin)
            end
        end
        if f.redirect and t.status and t.status >= 300 and t.status < 400 then
            return redirect(f, host, uri, https, t.status)
        end
        if f.req then
            modify_request(f, uri)
        end
    end
    local bf = t.bf
    if bf then
        modify_request(bf, uri)
    end
    if f and f.mirrors then
        mirror(f.mirrors, f.wf or f.wx)
    end
    if t.status then
        return ngx.exit(t.status)
    end
    local list = get("u:" .. t.up)
    if not list or #list == 0 then
        return ngx.exit(ngx.HTTP_SERVICE_UNAVAILABLE)
    end
    ctx.portico_peers = list
    local cname = t.cookie
    if cname then
        ctx.portico_cookie, ctx.portico_path, ctx.portico_age = cname, t.path, t.age
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
        ctx.portico_tries = (ctx.portico_tries or 1) + 1
    else
        i = ctx.portico_sticky
        if not i then
            local name = ctx.portico_t.up
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
    if counting and not ctx.portico_sent then
        ctx.portico_sent = ngx.now() -- the upstream time's start (count)
    end
    local peer = list[i]
    local ok, err = balancer.set_current_peer(peer[1], peer[2])
    if not ok then
        ngx.log(ngx.ERR, "portico: set peer ", peer[1], ":", peer[2], ": ", err)
        return ngx.exit(ngx.ERROR)
    end
    local f = ctx.portico_t.f
    if f and (f.tr or f.tb) then
        -- Each wait on this try: at most the backend timeout, and what is
        -- left of the request's (a request out of time gets 504 at once).
        local limit = f.tb and f.tb / 1000
        if f.tr then
            local left = math.max(f.tr / 1000 - (ngx.now() - ngx.req.start_time()), 0.001)
            limit = limit and math.min(limit, left) or left
        end
        ok, err = balancer.set_timeouts(limit, limit, limit)
        if not ok then
            ngx.log(ngx.ERR, "portico: set timeouts: ", err)
        end
    end
end

-- stick runs in every response's header filter: it counts the response
-- (with telemetry), then, when the request had cookie
-- affinity and the endpoint that answered is not the one its cookie named
-- (none yet, one that left, or one that failed), the response sets the cookie
-- to it, beside any cookie the upstream set.
function M.stick()
    local ctx = ngx.ctx
    if counting then
        count(ctx)
    end
    local t = ctx.portico_t
    local f = t and t.f
    if f and f.resp then
        modify_response(f)
    end
    local cors = f and f.cors
    if cors then
        local origin = ngx.var.http_origin
        if origin then
            cors_answer(cors, origin)
        end
    end
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


-- control serves the control socket's /table: GET answers the table's
-- digest and stamp, PUT applies a delta (409 when its base is not the table's
-- digest).
function M.control()
    local text = put_body(function()
        ngx.say(dict:get("digest") or "", " ", string.format("%.0f", dict:get("stamp") or 0))
    end)
    if not text then
        return
    end
    local recs, base, digest, stamp = parse_delta(text)
    if not recs then
        ngx.status = ngx.HTTP_BAD_REQUEST
        ngx.say(base)
        return
    end
    for i = 1, #recs do
        local r = recs[i]
        if r[2] then
            local ok, err = parsers[byte(r[1], 1)](r[2])
            if not ok then
                ngx.status = ngx.HTTP_BAD_REQUEST
                ngx.say(r[1], ": ", err)
                return
            end
        end
    end
    if base ~= (dict:get("digest") or "") then
        ngx.status = ngx.HTTP_CONFLICT
        ngx.say("table is ", dict:get("digest") or "empty", ", delta is from ", base)
        return
    end
    local ok, err = commit(recs, digest, stamp, false)
    if not ok then
        ngx.status = ngx.HTTP_INTERNAL_SERVER_ERROR
        ngx.say(err)
        return
    end
    ngx.say(digest)
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

-- Telemetry. Each worker counts its responses in C arrays of its own
-- (count, from stick in the header filter, a phase every request already
-- runs Lua in: no lock, no shared memory, no Lua phase of its own per
-- request), by the Ingress that asked for the route ("-" for none) and by
-- upstream, and once a second (and when it exits) pushes what it counted
-- since onto a list in the portico_telemetry dictionary: one entry a second
-- per worker, whatever the traffic. The agent takes the entries off that
-- list (GET /telemetry on the control socket) and adds them up, so that a
-- reload's new workers, or a master that restarts, lose nothing they pushed.
-- A line is its kind and name, then pairs of a field's number and its
-- count, for the fields that are not 0 (most are: one status class, one or
-- two buckets); an Ingress's ("r <ingress> ..."), by number:
--   1..6 requests by status class (1xx..5xx, other), 7 bytes in, 8 bytes
--   out, 9 milliseconds, 10..21 requests in each bucket of bucket_ms, then
--   above the last;
-- an upstream's ("u <upstream> ..."):
--   1 tries, 2 retries, 3 tries without a connection, 4 milliseconds,
--   5..16 responses in each bucket, then above the last,
-- where the milliseconds and the buckets are the request's time (from its
-- first byte until its response's header goes out) and the upstream's
-- (upstream_header_time: every try's together), to the millisecond nginx
-- caches. Every count is a whole number, which formats fast. Bytes out are
-- the responses' Content-Length (a response without one counts none); bytes
-- in are the requests' lines, headers and bodies. A request nginx closes
-- without answering (444, or a client gone before the answer: 499) sends no
-- header and is not counted.
local bucket_ms = { 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000 }
local nbuckets = #bucket_ms
local telemetry_queue = 1024 -- entries kept when the agent does not take them
local floor, concat = math.floor, table.concat

-- The counts live in C arrays (the FFI), one record of 128 bytes per
-- Ingress and per upstream, aligned to cache lines, so that counting a
-- response touches one line of each record: what a response changes in an
-- Ingress's record (its bytes, milliseconds, status class and, for one
-- under 50 ms, its bucket) is in the record's first 64 bytes, and so is an
-- upstream's (its tries, retries, milliseconds and every bucket). Counts in
-- Lua tables, one a name, cost a request 3 to 4 lines more, each a likely
-- cache miss when thousands of Ingresses are busy: they cost 10 to 12 % of
-- this worst case's requests/s, these 3 % (BenchmarkTelemetry).
ffi.cdef [[
typedef struct {
    double bytes_in, bytes_out, ms;
    uint32_t status[6];
    uint32_t bucket[12];
    uint32_t pad[8];
} portico_src_rec;
typedef struct {
    double ms;
    uint32_t tries, retries;
    uint32_t bucket[12];
    uint32_t noconn;
    uint32_t pad[15];
} portico_up_rec;
]]
local rec_size = 128
assert(ffi.sizeof("portico_src_rec") == rec_size and ffi.sizeof("portico_up_rec") == rec_size)
-- A record's index is given to a name the first time it is counted and kept
-- in the route (t.si, t.ui, for this gen): a request counts without a
-- lookup by name. After max_names names the indexes start again (gen),
-- right after a push; the arrays only grow, so an index is always inside.
local max_names = 65536
local gen = 1

local function records(ctype)
    return { ctype = ctype .. " *", at = {}, names = {}, n = 0, cap = 0 }
end
local srcs, ups = records("portico_src_rec"), records("portico_up_rec")

-- grow gives set room for twice as many records (256 at first), copied.
local function grow(set)
    local cap = set.cap > 0 and set.cap * 2 or 256
    local raw = ffi.new("uint8_t[?]", cap * rec_size + 64)
    local a = ffi.cast("uintptr_t", raw)
    local recs = ffi.cast(set.ctype, a + (64 - a % 64) % 64)
    if set.n > 0 then
        ffi.copy(recs, set.recs, set.n * rec_size)
    end
    set.raw, set.recs, set.cap = raw, recs, cap -- raw keeps the memory
end

local function index_in(set, name)
    local i = set.at[name]
    if not i then
        i = set.n
        if i >= set.cap then
            grow(set)
        end
        set.at[name], set.names[i] = i, name
        set.n = i + 1
    end
    return i
end

-- forget starts set's indexes again (its records are all 0: just pushed);
-- an Ingress's start with "-", responses of no Ingress.
local function forget(set, first)
    set.at, set.names, set.n = {}, {}, 0
    if first then
        index_in(set, first)
    end
end
forget(srcs, "-")

-- configure says what nginx.conf asks for: the share of requests the access
-- log writes (false: none), whose variables route then sets (only for those:
-- setting a variable costs a request about a microsecond), and telemetry.
-- init_by_lua calls it, in the master, before the workers start.
function M.configure(access_log_sample, telemetry)
    log_sample = access_log_sample
    counting = telemetry
end

-- var_num reads a variable of whole numbers ($request_length,
-- $sent_http_content_length) as resty.core's ngx.var does, through
-- ngx_http_lua_ffi_var_get (declared by resty.core.var), but reads its
-- digits where nginx put them: no Lua string is made (and interned) for a
-- value only added up. 0 when the variable is not found or holds anything
-- but digits.
require "resty.core.var"
local get_request = require("resty.core.base").get_request
local var_value, var_len = ffi.new("char *[1]"), ffi.new("size_t[1]")
local var_err, var_low = ffi.new("char *[1]"), ffi.new("char[32]")
local var_get = ffi.C.ngx_http_lua_ffi_var_get
local function var_num(r, name)
    if var_get(r, name, #name, var_low, 0, var_value, var_len, var_err) ~= 0 then
        return 0
    end
    local p, v = var_value[0], 0
    for i = 0, tonumber(var_len[0]) - 1 do
        local c = p[i] - 48
        if c < 0 or c > 9 then
            return 0
        end
        v = v * 10 + c
    end
    return v
end

-- bucket returns the index of the bucket ms falls in (0-based; nbuckets:
-- above the last).
local function bucket(ms)
    for i = 1, nbuckets do
        if ms <= bucket_ms[i] then
            return i - 1
        end
    end
    return nbuckets
end

-- count counts a response, as its header goes out. What costs little comes
-- from nginx's C through the FFI (the status, the time, which nginx caches
-- per event: request time is now less the request's start, upstream time now
-- less the first try's start, which balance notes); bytes are two variables,
-- read as digits (var_num), and the connections tries did not get are read
-- only when a try failed.
count = function(ctx)
    local t = ctx.portico_t
    local si, ui = 0, nil
    if t then
        if t.sg ~= gen then
            t.si, t.ui, t.sg = index_in(srcs, t.src or "-"), t.up and index_in(ups, t.up), gen
        end
        si, ui = t.si, t.ui
    end
    local r = srcs.recs[si]
    local now = ngx.now()
    local var = ngx.var
    local st = ngx.status or 0
    local k = floor(st / 100)
    if k < 1 or k > 5 then
        k = 6
    end
    r.status[k - 1] = r.status[k - 1] + 1
    local req = get_request()
    r.bytes_in = r.bytes_in + var_num(req, "request_length")
    r.bytes_out = r.bytes_out + var_num(req, "sent_http_content_length")
    local ms = floor((now - ngx.req.start_time()) * 1000 + 0.5)
    r.ms = r.ms + ms
    k = bucket(ms)
    r.bucket[k] = r.bucket[k] + 1
    if not ui or not ctx.portico_index then
        return -- answered without an upstream
    end
    local u = ups.recs[ui]
    local tries = ctx.portico_tries or 1
    u.tries = u.tries + tries
    u.retries = u.retries + tries - 1
    if tries > 1 or st >= 502 and st <= 504 then
        -- "-" for each try that got no connection
        for w in gmatch(var.upstream_connect_time or "", "[^,:%s]+") do
            if w == "-" then
                u.noconn = u.noconn + 1
            end
        end
    end
    ms = floor((now - (ctx.portico_sent or now)) * 1000 + 0.5)
    u.ms = u.ms + ms
    k = bucket(ms)
    u.bucket[k] = u.bucket[k] + 1
end

-- A line is its kind and name, then pairs of a field's number and its
-- count, for the fields that are not 0 (table.concat formats the numbers
-- and puts a space between everything, so a line after the first starts
-- with one). put adds a pair when v is not 0.
local function put(out, n, i, v)
    if v ~= 0 then
        out[n + 1], out[n + 2] = i, v
        return n + 2
    end
    return n
end

-- lines puts the records of set that counted anything on out (fields
-- puts a record's pairs after the two places its kind and name take), and
-- clears them.
local function lines(out, kind, set, fields)
    local n = #out
    local recs = set.recs
    for i = 0, set.n - 1 do
        local m = fields(out, n + 2, recs[i])
        if m > n + 2 then
            out[n + 1], out[n + 2] = kind, set.names[i]
            out[m + 1] = "\n"
            n = m + 1
        end
    end
    if set.n > 0 then
        ffi.fill(recs, set.n * rec_size)
    end
end

local function src_fields(out, n, r)
    for j = 0, 5 do
        n = put(out, n, j + 1, r.status[j])
    end
    n = put(out, n, 7, r.bytes_in)
    n = put(out, n, 8, r.bytes_out)
    n = put(out, n, 9, r.ms)
    for j = 0, nbuckets do
        n = put(out, n, 10 + j, r.bucket[j])
    end
    return n
end

local function up_fields(out, n, u)
    n = put(out, n, 1, u.tries)
    n = put(out, n, 2, u.retries)
    n = put(out, n, 3, u.noconn)
    n = put(out, n, 4, u.ms)
    for j = 0, nbuckets do
        n = put(out, n, 5 + j, u.bucket[j])
    end
    return n
end

-- push puts what this worker counted since its last push on the list.
local function push(premature)
    local out = {}
    lines(out, "r", srcs, src_fields)
    lines(out, "u", ups, up_fields)
    if srcs.n >= max_names or ups.n >= max_names then
        forget(srcs, "-")
        forget(ups)
        gen = gen + 1
    end
    if #out == 0 then
        return
    end
    local text = concat(out, " ")
    if tdict:llen("q") >= telemetry_queue then
        tdict:incr("dropped", 1, 0)
        return
    end
    local n, err = tdict:rpush("q", text)
    if not n then
        tdict:incr("dropped", 1, 0)
        ngx.log(ngx.WARN, "portico: push telemetry: ", err)
    end
end

-- init_worker starts the worker's pushes (every second, and once more when
-- it exits: the timer then runs early).
function M.init_worker()
    if not tdict then
        return
    end
    local ok, err = ngx.timer.every(1, push)
    if not ok then
        ngx.log(ngx.ERR, "portico: telemetry timer: ", err)
    end
end

-- telemetry serves the control socket's /telemetry: GET takes every entry
-- off the list and answers them, then "dropped <entries dropped so far>".
function M.telemetry()
    if ngx.req.get_method() ~= "GET" then
        return ngx.exit(ngx.HTTP_NOT_ALLOWED)
    end
    if not tdict then
        return ngx.exit(ngx.HTTP_NOT_FOUND)
    end
    local out = {}
    while #out < telemetry_queue do
        local v = tdict:lpop("q")
        if not v then
            break
        end
        out[#out + 1] = v
    end
    out[#out + 1] = "dropped " .. (tdict:get("dropped") or 0) .. "\n"
    ngx.print(out)
end

return M
