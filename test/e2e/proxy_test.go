package e2e

import (
	"io"
	"net"
	"sync"
	"testing"
)

// tcpProxy forwards loopback TCP connections to a target address, and can
// cut a client off: Cut closes every forwarded connection and holds every
// new one open without forwarding a byte (a blackhole: the client waits on
// its own timeouts, as behind a dropped route); Heal forwards again and
// closes the held connections.
type tcpProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]struct{} // both ends of forwarded connections
	held   []net.Conn            // accepted while cut
	closed bool
	wg     sync.WaitGroup
}

func newTCPProxy(t testing.TB, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's listening address (127.0.0.1:port).
func (p *tcpProxy) Addr() string { return p.ln.Addr().String() }

func (p *tcpProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		switch {
		case p.closed:
			p.mu.Unlock()
			c.Close()
			continue
		case p.cut:
			p.held = append(p.held, c)
			p.mu.Unlock()
			continue
		}
		p.mu.Unlock()
		p.wg.Add(1)
		go p.forward(c)
	}
}

func (p *tcpProxy) forward(c net.Conn) {
	defer p.wg.Done()
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	if p.cut || p.closed {
		p.mu.Unlock()
		s.Close()
		c.Close()
		return
	}
	p.conns[c], p.conns[s] = struct{}{}, struct{}{}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		// One direction ended: end both, as a proxy that lost a side does.
		dst.Close()
		src.Close()
		done <- struct{}{}
	}
	go pipe(s, c)
	go pipe(c, s)
	<-done
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, s)
	p.mu.Unlock()
}

// Cut closes every forwarded connection and blackholes new ones.
func (p *tcpProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.Close()
	}
}

// Heal forwards new connections again and closes those held while cut.
func (p *tcpProxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
	for _, c := range p.held {
		c.Close()
	}
	p.held = nil
}

// Close stops the proxy and closes every connection.
func (p *tcpProxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.ln.Close()
	for c := range p.conns {
		c.Close()
	}
	for _, c := range p.held {
		c.Close()
	}
	p.held = nil
	p.mu.Unlock()
	p.wg.Wait()
}
