package robustness

import (
	"net"
	"sync"
	"time"
)

// Proxy is a TCP proxy on loopback between the clients and the server that
// the fault injector controls: it can cut every connection at once, refuse
// new ones, and blackhole traffic (accept and read, deliver nothing) until
// opened again, when the held bytes go through late or the connections are
// cut.
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	pairs  map[*pair]struct{}
	refuse bool
	gate   chan struct{} // closed while traffic flows; open channel while blackholed
	closed bool
	wg     sync.WaitGroup
}

type pair struct {
	client net.Conn
	done   chan struct{}
	once   sync.Once
	mu     sync.Mutex
	server net.Conn // guarded by mu
}

func (p *pair) cut() {
	p.once.Do(func() {
		close(p.done)
		p.client.Close()
		p.mu.Lock()
		s := p.server
		p.mu.Unlock()
		if s != nil {
			s.Close()
		}
	})
}

// NewProxy listens on 127.0.0.1 at a free port and forwards to target.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	gate := make(chan struct{})
	close(gate)
	p := &Proxy{ln: ln, target: target, pairs: map[*pair]struct{}{}, gate: gate}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// SetTarget makes new connections go to target (after a failover);
// existing ones stay where they are until cut.
func (p *Proxy) SetTarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
}

// Port is the proxy's listening port.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.closed || p.refuse {
			p.mu.Unlock()
			c.Close()
			continue
		}
		pr := &pair{client: c, done: make(chan struct{})}
		p.pairs[pr] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(pr)
	}
}

func (p *Proxy) currentGate() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gate
}

// waitOpen blocks while the proxy is blackholed; false if pr was cut.
func (p *Proxy) waitOpen(pr *pair) bool {
	for {
		g := p.currentGate()
		select {
		case <-pr.done:
			return false
		case <-g:
			// The gate may have been replaced (blackholed again) meanwhile.
			if p.currentGate() == g {
				return true
			}
		}
	}
}

func (p *Proxy) serve(pr *pair) {
	defer p.wg.Done()
	defer func() {
		pr.cut()
		p.mu.Lock()
		delete(p.pairs, pr)
		p.mu.Unlock()
	}()
	if !p.waitOpen(pr) {
		return
	}
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	s, err := net.DialTimeout("tcp", target, 2*time.Second)
	if err != nil {
		return
	}
	pr.mu.Lock()
	select {
	case <-pr.done:
		pr.mu.Unlock()
		s.Close()
		return
	default:
	}
	pr.server = s
	pr.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(pr, s, pr.client) }()
	go func() { defer wg.Done(); p.pipe(pr, pr.client, s) }()
	wg.Wait()
}

func (p *Proxy) pipe(pr *pair, dst, src net.Conn) {
	defer pr.cut()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.waitOpen(pr) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or error: the pair is cut either way
		}
	}
}

// Cut closes every connection (both sides) now.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	prs := make([]*pair, 0, len(p.pairs))
	for pr := range p.pairs {
		prs = append(prs, pr)
	}
	p.mu.Unlock()
	for _, pr := range prs {
		pr.cut()
	}
	return len(prs)
}

// SetRefuse makes the proxy close new connections at once (on) or accept
// them again (off).
func (p *Proxy) SetRefuse(on bool) {
	p.mu.Lock()
	p.refuse = on
	p.mu.Unlock()
}

// Blackhole holds every byte in both directions, and new connections before
// they reach the server, until Open.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
		p.gate = make(chan struct{})
	default: // already blackholed
	}
}

// Open lets traffic flow again after Blackhole, and stops refusing.
func (p *Proxy) Open() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = false
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

// Close stops the proxy and cuts every connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.Open()
	p.Cut()
	p.wg.Wait()
	return err
}
