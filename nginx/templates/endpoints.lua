        -- Portico's endpoint table: the addresses behind every upstream name, kept
        -- out of nginx.conf so that an endpoint change needs no reload. The agent
        -- writes it to a file that load reads into the shared dictionary whenever
        -- a master starts or reloads, and PUTs it to the control socket for live
        -- changes. Each worker parses it again when its version changes.
        --
        -- Format: a header "# portico endpoints <version>", then one line per
        -- upstream: its name and its endpoints ("10.0.0.1:80", "[fd00::1]:80").
        local balancer = require "ngx.balancer"

        local M = {}
        local dict = ngx.shared.portico_endpoints
        local max_tries = 3 -- proxy_next_upstream_tries
        local by_name = {} -- this worker's parsed table
        local version -- its version
        local next_index = {} -- round-robin position by upstream name

        local function parse(text)
            local ver = string.match(text, "^# portico endpoints (%x+)\n")
            if not ver then
                return nil, "no endpoint table header"
            end
            local t = {}
            for line in string.gmatch(text, "[^\n]+") do
                if string.byte(line, 1) ~= 35 then -- not the '#' header
                    local name, rest = string.match(line, "^([a-z0-9][a-z0-9.-]*)(.*)$")
                    if not name or (rest ~= "" and string.byte(rest, 1) ~= 32) then
                        return nil, "bad upstream line: " .. string.sub(line, 1, 80)
                    end
                    local list = {}
                    for ep in string.gmatch(rest, "%S+") do
                        local host, port = string.match(ep, "^([%d.]+):(%d+)$")
                        if not host then
                            host, port = string.match(ep, "^(%[[%x:.]+%]):(%d+)$")
                        end
                        port = port and tonumber(port)
                        if not host or port < 1 or port > 65535 then
                            return nil, "bad endpoint of " .. name .. ": " .. string.sub(ep, 1, 80)
                        end
                        list[#list + 1] = { host, port }
                    end
                    t[name] = list
                end
            end
            return t, ver
        end

        -- store checks a table and makes it the current one. The version goes
        -- last: a worker that sees it finds this table or a newer one.
        local function store(text)
            local t, ver = parse(text)
            if not t then
                return nil, ver
            end
            local ok, err = dict:safe_set("table", text)
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
            if string.byte(path, 1) ~= 47 then -- relative to the prefix, like nginx's paths
                path = ngx.config.prefix() .. path
            end
            local f, err = io.open(path, "rb")
            if not f then
                error("portico: read endpoint table: " .. err)
            end
            local text = f:read("*a")
            f:close()
            local ver, serr = store(text)
            if not ver then
                error("portico: load endpoint table " .. path .. ": " .. serr)
            end
        end

        local function refresh()
            local ver = dict:get("version")
            if ver == version then
                return
            end
            local text = dict:get("table")
            if not text then
                return
            end
            local t, v = parse(text)
            if not t then -- cannot happen: store checked it
                ngx.log(ngx.ERR, "portico: endpoint table: ", v)
                version = ver
                return
            end
            by_name, version = t, v
        end

        -- route runs at the end of every request's rewrite phase: a location that
        -- proxies names its upstream in $portico_upstream; one without endpoints
        -- answers 503.
        function M.route()
            local name = ngx.var.portico_upstream
            if not name or name == "" then
                return
            end
            refresh()
            local list = by_name[name]
            if not list or #list == 0 then
                return ngx.exit(ngx.HTTP_SERVICE_UNAVAILABLE)
            end
            local ctx = ngx.ctx
            ctx.portico_name = name
            ctx.portico_peers = list
        end

        -- balance picks the endpoint: round robin per worker, and the next
        -- endpoint when nginx retries after a failed connection.
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
                local name = ctx.portico_name
                i = (next_index[name] or ngx.worker.pid()) % n + 1
                next_index[name] = i
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

        -- control serves the control socket: GET answers the version in use, PUT
        -- replaces the table.
        function M.control()
            local method = ngx.req.get_method()
            if method == "GET" then
                ngx.say(dict:get("version") or "")
                return
            end
            if method ~= "PUT" then
                return ngx.exit(ngx.HTTP_NOT_ALLOWED)
            end
            ngx.req.read_body()
            local text = ngx.req.get_body_data()
            if not text then
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

        portico = M
