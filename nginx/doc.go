// Package nginx is the last step of Portico's L7 path: it turns the control plane's
// model.Snapshot into an nginx.conf (a pure render from embedded templates), writes the
// TLS material it references, validates the candidate with `nginx -t`, swaps it in
// atomically and reloads a master process that it starts and supervises.
//
// # Path semantics
//
// Locations follow the Ingress specification:
//   - Exact "/p" renders "location = /p". Exact "/p/" also renders "location = /p",
//     which answers as "/p" would without it (the longest prefix location, or the
//     default backend or 404): nginx would otherwise redirect "/p" to "/p/" (301),
//     and the specification says Exact "/p/" does not match "/p".
//   - Prefix "/p" matches by path element: "location = /p" plus "location /p/", so
//     "/p" and "/p/..." match and "/pq" does not. A trailing slash is ignored
//     ("/p/" is the same as "/p"); Prefix "/" matches everything.
//   - ImplementationSpecific is treated as Prefix, as ingress-nginx does (for paths
//     without regular expressions, which Portico never renders).
//
// nginx picks an exact location first and otherwise the longest matching prefix,
// which is the Ingress rule "longest path wins, Exact before Prefix on a tie". When an
// Exact and a Prefix path are equal, the Exact one owns "location = /p".
//
// Host names are exact or "*.suffix" wildcards; a wildcard matches exactly one extra
// DNS label (the Ingress rule), so it renders as a regular-expression server name. A
// Server whose Host is "" (an Ingress rule without a host, or an Ingress that has only
// a default backend) takes the place of the default server; without one, unknown
// hosts have their connection closed (return 444), or get a 404 when the rendered
// group (Options.Group) asks for it (model.UnmatchedHostNotFound). A TLS handshake
// for an unknown name is refused either way (see below).
//
// # TLS
//
// Only hosts with a valid certificate listen on the HTTPS port; a handshake for any
// other name reaches the default server, which rejects it (ssl_reject_handshake)
// unless a catch-all Server has a certificate. A certificate that does not parse
// removes only its hosts' TLS server, as does one that nginx -t refuses (OpenSSL can
// be stricter than Go: a 1024-bit RSA key, say), which the Reloader finds in nginx's
// message. A host that asks for the HTTPS redirect keeps redirecting even then: its
// traffic is never served in clear text. A redirect asked for a host with no TLS at
// all is ignored and reported, since nothing would answer on the HTTPS side.
//
// # Injection
//
// No free-form text reaches the configuration. Host names, paths, upstream names and
// endpoint addresses are checked against strict grammars; a value that fails is left
// out and reported as a model.Problem, and the rest of the configuration is rendered.
//
// # Endpoint changes
//
// Endpoints are not in nginx.conf. Every proxying location names its upstream
// ($portico_upstream) and passes to one upstream whose balancer_by_lua picks an
// endpoint from a table in a shared dictionary (Debian's libnginx-mod-http-lua, the
// mechanism ingress-nginx uses): round robin per worker, the next endpoint when a
// connection fails (up to proxy_next_upstream_tries), and 503 for an upstream with
// none. Two snapshots that differ only in endpoints therefore render the same text.
// The Lua code is not in nginx.conf either: the Reloader writes it (lua/portico.lua)
// beside nginx.conf, which loads it with require and names its digest.
//
// The Reloader writes the table (Config.Endpoints) to Options.EndpointsFile, which
// the master loads into the dictionary at every start and reload (init_by_lua), so
// nginx never serves with an empty table; a change of endpoints only is also PUT to
// Options.ControlSocket, a unix socket in a private directory, and every worker uses
// it from its next request on: no nginx -t, no reload, no new workers. Any other
// change is rendered, validated with nginx -t, swapped in and reloaded; reloads are
// coalesced (Config.Debounce). While nginx -t refuses the latest configuration, the
// last good one keeps running and endpoint changes still reach it: its upstreams get
// the endpoints of the latest snapshot (none for an upstream the snapshot no longer
// has), pushed as above, so one bad object does not freeze every host's endpoints.
//
// # Cookie affinity
//
// A location with cookie affinity (model.CookieAffinity) passes its cookie's
// name, path and max-age after the upstream name in $portico_upstream. The cookie
// names an endpoint by the first 16 hex digits of the MD5 of its "address:port":
// derived from the address alone, so the nginx of every replica, each with its
// own round robin, sends a cookie to the same endpoint, and a change of the
// endpoint table (no reload) moves only the clients whose endpoint left. A
// request whose cookie names an endpoint the upstream has goes there first (the
// next endpoints on a failed connection, as without affinity); the response sets
// the cookie (Path the Ingress path, HttpOnly, Max-Age when given) whenever the
// endpoint that answered is not the one it named.
//
// The price is paid by full reloads: Debian 12's Lua module (0.10.23) creates an
// OpenSSL context for every location and server block it merges, used or not (for
// Lua's TLS sockets), about 0.13 ms and 14 KiB each. At 5,000 hosts (15,000 blocks)
// that makes nginx -t and a reload about 2 s slower and the configuration about
// 220 MiB larger; at 100 hosts, tens of milliseconds. BenchmarkReload and
// BenchmarkEndpointUpdate measure both paths.
package nginx
