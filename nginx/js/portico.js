// Portico's njs module for nginx's stream module. The agent writes it beside
// nginx.conf, which imports it (js_import) for its L4 Services.
//
// pick chooses the endpoint of every new connection (or UDP session) from the
// port's endpoint file, which the agent rewrites (by a rename) whenever the
// endpoints change: no reload, and connections that run keep their endpoint.
//
// proxyDatagrams is the filter of the UDP ports that ask for the PROXY
// protocol (portico.io/proxy-protocol): nginx sends a PROXY header only on
// TCP, so it puts a PROXY protocol version 2 header (DGRAM, the client's
// address and port, the VIP and port) in front of every datagram the client
// sends, as dnsdist and HAProxy expect on UDP.

var fs = require('fs');

// fnv1a is the 32-bit FNV-1a hash of a string's UTF-16 code units.
function fnv1a(str) {
    var h = 0x811c9dc5;
    for (var i = 0; i < str.length; i++) {
        h = Math.imul(h ^ str.charCodeAt(i), 0x01000193) >>> 0;
    }
    return h;
}

// pick is the js_set of $portico_l4_peer. $portico_l4 names the port's
// endpoint file, then " route" when the file is a steered route's (whose
// first word is its balancing, "hash" or "any"), or " hash" for
// client-address affinity: the endpoint with
// the highest hash of the client's address and its own (rendezvous hashing),
// so that an endpoint that leaves moves only its own clients. Otherwise one at
// random. "" (the session ends) when the file is missing or empty.
function pick(s) {
    var spec = s.variables.portico_l4.split(' ');
    var eps;
    try {
        eps = fs.readFileSync(spec[0], 'utf8').trim().split(' ');
    } catch (e) {
        s.error('portico: read endpoints: ' + e.message);
        return '';
    }
    var mode = spec[1];
    if (mode == 'route') {
        // A steered route's file: its balancing, then its endpoints.
        mode = eps.shift();
    }
    if (eps.length == 0 || eps[0] == '') {
        return '';
    }
    if (mode != 'hash') {
        return eps[Math.floor(Math.random() * eps.length)];
    }
    var best = 0, bestHash = -1;
    for (var i = 0; i < eps.length; i++) {
        var h = fnv1a(s.remoteAddress + ' ' + eps[i]);
        if (h > bestHash) {
            best = i;
            bestHash = h;
        }
    }
    return eps[best];
}

var signature = [0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d, 0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a];

// ip4 returns the 4 bytes of a dotted IPv4 address.
function ip4(a) {
    return Buffer.from(a.split('.').map(Number));
}

// ip6 returns the 16 bytes of an IPv6 address ("::" expanded; an embedded
// IPv4 tail is not produced by nginx for sockets of this family).
function ip6(a) {
    var halves = a.split('::');
    var head = halves[0] ? halves[0].split(':') : [];
    var tail = halves.length > 1 && halves[1] ? halves[1].split(':') : [];
    var groups = head.concat(new Array(8 - head.length - tail.length).fill('0'), tail);
    var b = Buffer.alloc(16);
    for (var i = 0; i < 8; i++) {
        b.writeUInt16BE(parseInt(groups[i], 16), 2 * i);
    }
    return b;
}

// header builds the PROXY v2 header of a UDP session.
function header(s) {
    var src = s.remoteAddress, dst = s.variables.server_addr;
    var six = src.indexOf(':') >= 0;
    var addrs = six ? Buffer.concat([ip6(src), ip6(dst)]) : Buffer.concat([ip4(src), ip4(dst)]);
    var h = Buffer.alloc(16 + addrs.length + 4);
    Buffer.from(signature).copy(h, 0);
    h[12] = 0x21; // version 2, PROXY
    h[13] = six ? 0x22 : 0x12; // AF_INET6 or AF_INET, DGRAM
    h.writeUInt16BE(addrs.length + 4, 14);
    addrs.copy(h, 16);
    h.writeUInt16BE(Number(s.variables.remote_port), 16 + addrs.length);
    h.writeUInt16BE(Number(s.variables.server_port), 18 + addrs.length);
    return h;
}

// proxyDatagrams is the js_filter of a UDP server with the PROXY protocol.
function proxyDatagrams(s) {
    var h = header(s);
    s.on('upload', function (data, flags) {
        s.send(Buffer.concat([h, Buffer.from(data)]), flags);
    });
}

export default { pick, proxyDatagrams };
