package robustness

import (
	"context"
	"fmt"
	"math/rand"
	"syscall"
	"time"
)

// Fault kinds.
const (
	FaultKill  = "kill"  // SIGKILL the server (every process), then restart it: crash recovery
	FaultProxy = "proxy" // cut / refuse / blackhole client connections at the proxy
	FaultStop  = "stop"  // SIGSTOP a client process, SIGCONT later
	FaultClock = "clock" // step the server's wall clock (libfaketime)
	// FaultFailover: the asynchronous standby is cut off, the primary goes
	// on for a while (an unreplayed tail), is killed, and the standby is
	// promoted; the proxy then leads to it, and a new standby is made.
	// Needs pg_lease 0.3.0 (epochs across timelines, promotion grace); the
	// history is then checked with the rules that hold across a failover.
	FaultFailover = "failover"
)

// AllFaults lists the fault kinds of a default run (failover is asked for
// explicitly: see FaultFailover).
var AllFaults = []string{FaultKill, FaultProxy, FaultStop, FaultClock}

// KnownFaults lists every fault kind.
var KnownFaults = append(append([]string(nil), AllFaults...), FaultFailover)

// PlannedFault is one entry of the schedule, drawn from the seed before the
// run starts.
type PlannedFault struct {
	At     time.Duration // from the start of the run
	Kind   string
	Mode   string
	Dur    time.Duration
	Target int           // stop: index into the worker processes
	Step   time.Duration // clock: change of the offset
}

// Plan draws the fault schedule for a run of duration d from seed: gaps of
// 1-3.5 s, a kind among kinds (each kind once first), and its parameters. The same seed and
// arguments give the same schedule.
func Plan(seed int64, d time.Duration, kinds []string, procs int) []PlannedFault {
	rng := rand.New(rand.NewSource(seed ^ 0x5eed_fa17))
	var usable []string
	for _, k := range kinds {
		if k == FaultStop && procs == 0 {
			continue
		}
		usable = append(usable, k)
	}
	// Every kind comes once, in an order drawn from the seed, before kinds
	// are drawn at random: a run long enough for len(usable) faults injects
	// each kind it claims (at most 4.5 s per fault: 30 s cover 5 kinds).
	first := rng.Perm(len(usable))
	var plan []PlannedFault
	at := time.Second
	for len(usable) > 0 {
		at += time.Second + time.Duration(rng.Int63n(int64(2500*time.Millisecond)))
		if at > d-time.Second {
			break
		}
		kind := usable[rng.Intn(len(usable))]
		if len(plan) < len(first) {
			kind = usable[first[len(plan)]]
		}
		f := PlannedFault{At: at, Kind: kind}
		r := rng.Float64()
		dur := time.Duration(rng.Int63n(int64(2 * time.Second)))
		switch f.Kind {
		case FaultKill:
			f.Dur = dur / 2 // down for 0-1 s
		case FaultProxy:
			switch {
			case r < 0.35:
				f.Mode = "cut"
			case r < 0.6:
				f.Mode, f.Dur = "refuse", dur/2
			case r < 0.8:
				f.Mode, f.Dur = "blackhole-cut", dur
			default:
				f.Mode, f.Dur = "blackhole-resume", dur
			}
		case FaultStop:
			f.Target = rng.Intn(max(procs, 1))
			f.Dur = 300*time.Millisecond + dur + dur/2 // 0.3-3.3 s: longer than most TTLs
		case FaultFailover:
			f.Dur = 200*time.Millisecond + dur/2 // unreplayed tail: 0.2-1.2 s
		case FaultClock:
			step := 300*time.Millisecond + time.Duration(rng.Int63n(int64(5700*time.Millisecond)))
			if r < 0.5 {
				step = -step
			}
			f.Step = step
		}
		plan = append(plan, f)
	}
	return plan
}

// Target is what the injector acts on.
type Target interface {
	Kill() error
	Start(ctx context.Context) error
	SetClockOffset(d time.Duration) error
}

// Injector runs a schedule.
type Injector struct {
	Server Target
	// Failover performs a failover fault whose unreplayed tail lasts tail
	// (set when the schedule has failover faults).
	Failover func(ctx context.Context, tail time.Duration) (detail string, err error)
	Proxy    *Proxy
	Pids     []int // worker processes (stop)
	Offset   time.Duration
	MaxSkew  time.Duration // |offset| bound; zero: 20 s
	Logf     func(format string, args ...any)
}

// Run executes plan from start (Mono()), recording every fault. A fault
// that overruns delays the next ones (their times are then not reproduced
// exactly).
func (in *Injector) Run(ctx context.Context, start int64, plan []PlannedFault) []Fault {
	if in.MaxSkew == 0 {
		in.MaxSkew = 20 * time.Second
	}
	var out []Fault
	for _, p := range plan {
		wait := time.Duration(start + int64(p.At) - Mono())
		if wait > 0 {
			sleepCtx(ctx, wait)
		}
		if ctx.Err() != nil {
			break
		}
		f := in.do(ctx, p)
		if in.Logf != nil {
			in.Logf("fault %s %s %v: %s %s", f.Kind, f.Mode, time.Duration(f.End-f.Start).Round(time.Millisecond), f.Detail, f.Err)
		}
		out = append(out, f)
	}
	return out
}

func errStr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func (in *Injector) do(ctx context.Context, p PlannedFault) Fault {
	f := Fault{Kind: p.Kind, Mode: p.Mode, Start: Mono()}
	switch p.Kind {
	case FaultKill:
		err := in.Server.Kill()
		sleepCtx(ctx, p.Dur)
		var serr error
		for i := 0; i < 3; i++ {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
			serr = in.Server.Start(sctx)
			cancel()
			if serr == nil {
				break
			}
		}
		f.Err = errStr(errorsJoin(err, serr))
		f.Detail = fmt.Sprintf("down %v", p.Dur.Round(time.Millisecond))
	case FaultProxy:
		switch p.Mode {
		case "cut":
			f.Detail = fmt.Sprintf("cut %d connections", in.Proxy.Cut())
		case "refuse":
			in.Proxy.SetRefuse(true)
			n := in.Proxy.Cut()
			sleepCtx(ctx, p.Dur)
			in.Proxy.Open()
			f.Detail = fmt.Sprintf("cut %d, refused for %v", n, p.Dur.Round(time.Millisecond))
		case "blackhole-cut", "blackhole-resume":
			in.Proxy.Blackhole()
			sleepCtx(ctx, p.Dur)
			n := 0
			if p.Mode == "blackhole-cut" {
				n = in.Proxy.Cut()
			}
			in.Proxy.Open()
			f.Detail = fmt.Sprintf("blackholed %v, then cut %d", p.Dur.Round(time.Millisecond), n)
		}
	case FaultStop:
		if len(in.Pids) == 0 {
			f.Err = "no worker process"
			break
		}
		i := p.Target % len(in.Pids)
		pid := in.Pids[i]
		f.Target = i
		err := syscall.Kill(pid, syscall.SIGSTOP)
		sleepCtx(ctx, p.Dur)
		err2 := syscall.Kill(pid, syscall.SIGCONT)
		f.Err = errStr(errorsJoin(err, err2))
		f.Detail = fmt.Sprintf("worker %d (pid %d) stopped %v", i, pid, p.Dur.Round(time.Millisecond))
	case FaultFailover:
		if in.Failover == nil {
			f.Err = "no standby"
			break
		}
		detail, err := in.Failover(ctx, p.Dur)
		f.Detail, f.Err = detail, errStr(err)
	case FaultClock:
		before := in.Offset
		next := before + p.Step
		if next > in.MaxSkew || next < -in.MaxSkew {
			next = before - p.Step
		}
		f.Err = errStr(in.Server.SetClockOffset(next))
		in.Offset = next
		f.OffsetBefore, f.OffsetAfter = int64(before), int64(next)
		f.Detail = fmt.Sprintf("offset %v -> %v", before, next)
	}
	f.End = Mono()
	return f
}

func errorsJoin(a, b error) error {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	return fmt.Errorf("%v; %v", a, b)
}
