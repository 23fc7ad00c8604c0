// Portico's njs module for nginx's stream module. The agent writes it beside
// nginx.conf, which imports it (js_import) for the UDP ports of L4 Services that
// ask for the PROXY protocol (portico.io/proxy-protocol): nginx sends a PROXY
// header only on TCP, so this filter puts a PROXY protocol version 2 header
// (DGRAM, the client's address and port, the VIP and port) in front of every
// datagram the client sends, as dnsdist and HAProxy expect on UDP.

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

export default { proxyDatagrams };
