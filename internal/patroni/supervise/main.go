// Command supervise runs one Patroni process for internal/patroni and reaps
// every process that Patroni leaves behind.
//
// Patroni starts the postmaster the way pg_ctl does: through a process that
// exits at once, so the postmaster is orphaned and its new parent must reap
// it. An unreaped postmaster stays a zombie, and Patroni (which looks at the
// pid in postmaster.pid) then believes it still runs. This program declares
// itself a child subreaper, so the orphaned postmaster and its backends
// become its children, and it reaps them all.
//
//	supervise [-uid N -gid N] -- patroni config.yml
//
// It prints "pid N" (Patroni's pid) on standard output and exits when
// Patroni has exited and every other child is gone, with Patroni's status.
// SIGTERM or SIGINT is passed on to Patroni (which stops PostgreSQL); when
// Patroni has exited, whatever it left running is killed. After SIGUSR1 it
// is not: a postmaster that outlives Patroni (Patroni alone was killed)
// keeps running, and this program reaps it and exits once it is gone. The harness sets
// SIGTERM as this process's parent-death signal, so a test that dies stops
// its clusters too.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER of prctl(2).
const prSetChildSubreaper = 36

func main() {
	uid := flag.Int("uid", -1, "run the command as this user id")
	gid := flag.Int("gid", -1, "run the command as this group id")
	flag.Parse()
	args := flag.Args()
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "supervise: no command given")
		os.Exit(2)
	}
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		err := error(errno)
		fmt.Fprintln(os.Stderr, "supervise: PR_SET_CHILD_SUBREAPER:", err)
		os.Exit(2)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	var keep atomic.Bool
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)

	attr := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if *uid >= 0 {
		attr.Credential = &syscall.Credential{Uid: uint32(*uid), Gid: uint32(*gid), Groups: []uint32{}}
	}
	path := args[0]
	if !strings.Contains(path, "/") {
		p, err := lookPath(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "supervise:", err)
			os.Exit(2)
		}
		path = p
	}
	pid, err := syscall.ForkExec(path, args, &syscall.ProcAttr{
		Env:   os.Environ(),
		Files: []uintptr{0, 1, 2},
		Sys:   attr,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "supervise: starting", path+":", err)
		os.Exit(2)
	}
	fmt.Printf("pid %d\n", pid)

	go func() {
		for range sigs {
			_ = syscall.Kill(pid, syscall.SIGTERM)
		}
	}()
	// The harness sends SIGUSR1 and waits for "keep" before it kills
	// Patroni alone.
	go func() {
		for range usr1 {
			keep.Store(true)
			fmt.Println("keep")
		}
	}()

	code := -1
	for {
		var ws syscall.WaitStatus
		wpid, err := syscall.Wait4(-1, &ws, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil { // ECHILD: nothing is left
			break
		}
		if wpid == pid {
			code = ws.ExitStatus()
			if ws.Signaled() {
				code = 128 + int(ws.Signal())
			}
			// Patroni is gone: nothing may run without it (unless told
			// to keep it). A postmaster it stopped is gone already; one
			// it left (it was killed) is killed with its backends.
			if !keep.Load() {
				go killOrphans(pid)
			}
		}
	}
	os.Exit(code)
}

// killOrphans SIGKILLs every remaining child of this process and their
// children, a little later, so that a clean shutdown can finish first.
func killOrphans(patroni int) {
	time.Sleep(100 * time.Millisecond)
	self := os.Getpid()
	for _, p := range descendants(self) {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
}

// descendants lists the live descendants of pid from /proc.
func descendants(pid int) []int {
	parent := map[int]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 || f[0] == "Z" {
			continue
		}
		pp, _ := strconv.Atoi(f[1])
		parent[p] = pp
	}
	var out []int
	for p := range parent {
		for q := parent[p]; q > 1; q = parent[q] {
			if q == pid {
				out = append(out, p)
				break
			}
			if _, ok := parent[q]; !ok {
				break
			}
		}
	}
	return out
}

func lookPath(name string) (string, error) {
	for _, dir := range strings.Split(os.Getenv("PATH"), ":") {
		p := dir + "/" + name
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 && !fi.IsDir() {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found on PATH", name)
}
