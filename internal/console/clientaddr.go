package console

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// The client address a sign-in is throttled and every line is logged by.
// By default it is the connection's peer: a client writes whatever it
// likes in X-Forwarded-For, so trusting that header from anyone would let
// a password guesser pick a new address for every try. Behind a reverse
// proxy (an ingress controller), every person's peer is the proxy, so the
// per-address limit would lock everyone out together; the proxies named
// in TrustedProxies are therefore believed: X-Forwarded-For is read from
// the right (the entry the nearest proxy appended), past every trusted
// proxy, and the first address that is not one is the client's.

// clientAddr is the address r came from: its peer, or, when the peer is a
// trusted proxy, the address X-Forwarded-For gives past the trusted
// proxies. An entry that is not an address ends the walk at the last
// trusted hop: a malformed chain is held to the proxy's address, never to
// one a client wrote.
func (s *Server) clientAddr(r *http.Request) string {
	peer := r.RemoteAddr
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		peer = host
	}
	addr, err := netip.ParseAddr(peer)
	if err != nil || !s.trusted(addr) {
		return peer
	}
	var hops []string
	for _, h := range r.Header.Values("X-Forwarded-For") {
		hops = append(hops, strings.Split(h, ",")...)
	}
	client := addr.Unmap()
	for i := len(hops) - 1; i >= 0; i-- {
		hop, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
		if err != nil || hop.Zone() != "" {
			break
		}
		client = hop.Unmap()
		if !s.trusted(client) {
			break
		}
	}
	return client.String()
}

// trusted reports whether a is one of the trusted proxies.
func (s *Server) trusted(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range s.opt.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// throttleKey is the key a client address is throttled by: an IPv6
// client holds a whole /64 (a host picks its own addresses in it), so it
// is throttled by that prefix, not by each address it can make up.
func throttleKey(addr string) string {
	a, err := netip.ParseAddr(addr)
	if err != nil || !a.Is6() || a.Is4In6() {
		return addr
	}
	return netip.PrefixFrom(a, 64).Masked().String()
}
