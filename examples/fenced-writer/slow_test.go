package main

import (
	"context"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglease/pg_lease/internal/pgtest"
)

// TestTakeoverAfterASlowGrant: A's acquire reaches the server late (a busy
// machine, a slow network: here a proxy holds the request 400 ms), so the
// server's expiry comes 400 ms after A's earliest local bound (ValidUntil).
// B's takeover must wait for the server's expiry, not for that bound plus a
// guess: sleeping until ValidUntil + 100 ms, B was denied.
func TestTakeoverAfterASlowGrant(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn, storeDSN := pgtest.NewLeaseDatabase(t), pgtest.NewDatabase(t)
	p := newDelayProxy(t, dsn)
	p.delay.Store(int64(400 * time.Millisecond))

	// The proxy delays the lease database's requests until A has its grant.
	w := &lineHook{on: "A acquired", do: func() { p.delay.Store(0) }}
	if err := run(ctx, w, p.dsn, storeDSN, "report"); err != nil {
		t.Fatalf("%v\noutput:\n%s", err, w.b.String())
	}
	if !strings.Contains(w.b.String(), "B took report over with epoch 2") {
		t.Fatalf("output:\n%s", w.b.String())
	}
}

// lineHook records the output and calls do once a line contains on.
type lineHook struct {
	on   string
	do   func()
	once sync.Once
	b    strings.Builder
}

func (h *lineHook) Write(p []byte) (int, error) {
	if strings.Contains(string(p), h.on) {
		h.once.Do(h.do)
	}
	return h.b.Write(p)
}

// delayProxy forwards loopback TCP to the server of a DSN, holding each
// chunk from the client for delay (the replies pass at once).
type delayProxy struct {
	dsn   string
	delay atomic.Int64
}

func newDelayProxy(t *testing.T, dsn string) *delayProxy {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil || u.Host == "" {
		t.Fatalf("a postgres://host:port/ DSN is needed, got %q (%v)", dsn, err)
	}
	target := u.Host
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.Host = ln.Addr().String()
	p := &delayProxy{dsn: u.String()}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); _, _ = io.Copy(c, s); c.Close() }()
			go func() {
				defer wg.Done()
				defer s.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						time.Sleep(time.Duration(p.delay.Load()))
						if _, werr := s.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return p
}
