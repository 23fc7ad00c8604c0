// Package nginx is the last step of Portico's L7 path: it turns the control plane's
// model.Snapshot into what nginx serves, and keeps a master process that it starts
// and supervises serving it without cutting a connection.
//
// What a snapshot renders to is in two parts. nginx.conf (Config.Text) holds what
// only a reload can change: where nginx listens (the HTTP and HTTPS ports, each L4
// Service's addresses and ports) and nginx's own settings. The table
// (Config.Table) holds everything else: every host's routes, every certificate and
// every upstream's endpoints. The table lives in a shared dictionary that
// lua/portico.lua reads: one server block takes every host, finds its routes by
// host and path (route), picks the certificate of the name a client asks for
// (certificate) and the endpoint (balance). A change of hosts, paths,
// certificates, annotations' per-route settings or endpoints is a change of the
// table, which the Reloader sends to the control socket as a delta naming only the
// keys that changed: no nginx -t, no reload, no new workers, and each worker
// re-reads only those keys.
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
// A handshake gets the certificate of the host the client names (exact, then the
// wildcard one label up) when that host has a valid one, else the catch-all's,
// else it is refused, as ssl_reject_handshake would. A certificate that does not
// parse removes only its hosts' TLS, as does one that OpenSSL refuses (a 1024-bit
// RSA key, say, which Go accepts): new certificates are loaded by nginx -t of a
// small configuration of their own (checkWithNginx) before they join the table. A
// host that asks for the HTTPS redirect keeps redirecting even then: its traffic
// is never served in clear text. A redirect asked for a host with no TLS at all is
// ignored and reported, since nothing would answer on the HTTPS side. On the
// HTTPS port, a request for a host without a certificate reaches the catch-all
// (or is closed), as nginx's own TLS servers would have it.
//
// # Injection
//
// No free-form text reaches the configuration. Host names, paths, upstream names and
// endpoint addresses are checked against strict grammars; a value that fails is left
// out and reported as a model.Problem, and the rest of the configuration is rendered.
//
// # Changes without reloads
//
// The Reloader sends each change of the table to Options.ControlSocket, a unix
// socket in a private directory, as a delta from the table nginx has (named by
// its digest, Config.Digest); nginx refuses a delta from another table (409), and
// the Reloader then writes the whole table to Options.TableFile and reloads, which
// loads it. The file is also written before every start and reload, and once
// changes stop coming, so that a restarted agent finds what nginx has and goes on
// with deltas. A change of the table is applied at once; one that also needs a
// reload (a new L4 port, say) gets its table at once and its reload at once too
// when nginx was not started or reloaded within the debounce window
// (Config.Debounce); otherwise at the window's end, which coalesces the changes
// that came meanwhile into one reload. While nginx -t
// refuses the latest configuration, the last good one keeps running and still
// gets every change of the table, so one bad object does not freeze every host.
//
// A reload does not cut connections: the workers it replaces serve the
// connections they hold until those close (or Options.DrainTimeout). The
// configuration they hold is small (a few listen sockets), so each costs a few
// MiB while it drains.
//
// L4 Services go through nginx's stream module, which has no Lua: each port's
// endpoints are in a file (Options.L4Dir) that js/portico.js reads for every new
// connection or UDP session, so that an endpoint change rewrites the file and
// needs no reload either. With Options.L4Steered, TCP ports have no listeners
// of their own: two fixed listeners serve them all, package dataplane/steer
// gives each VIP:port to one (Config.L4Routes, ReloaderConfig.SteerL4), and
// portico.js finds the route's file by the accepted socket's address, so a TCP
// Service that comes or goes needs no reload either.
//
// # Cookie affinity
//
// A route with cookie affinity (model.CookieAffinity) carries its cookie's name,
// path and max-age after the upstream name in the table. The cookie
// names an endpoint by the first 16 hex digits of the MD5 of its "address:port":
// derived from the address alone, so the nginx of every replica, each with its
// own round robin, sends a cookie to the same endpoint, and a change of the
// endpoints (no reload) moves only the clients whose endpoint left. A
// request whose cookie names an endpoint the upstream has goes there first (the
// next endpoints on a failed connection, as without affinity); the response sets
// the cookie (Path the Ingress path, HttpOnly, Max-Age when given) whenever the
// endpoint that answered is not the one it named.
package nginx
