package pgserver

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// children returns the pids of the live processes whose parent is pid. The
// postmaster's children (backends, walwriter, checkpointer, ...) each call
// setsid(), so they are not in the postmaster's process group: signalling
// the group alone would miss them.
func children(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, state, ok := procStat(p)
		if ok && ppid == pid && state != 'Z' && state != 'X' {
			out = append(out, p)
		}
	}
	return out
}

// procStat reads the parent pid and state of pid from /proc/<pid>/stat.
func procStat(pid int) (ppid int, state byte, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// The command name is in parentheses and may contain anything.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, 0, false
	}
	ppid, err = strconv.Atoi(f[1])
	if err != nil {
		return 0, 0, false
	}
	return ppid, f[0][0], true
}

// procStartTime returns field 22 of /proc/<pid>/stat (start time in clock
// ticks since boot), which tells a live process from a reused pid.
func procStartTime(pid int) (string, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return "", false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return "", false
	}
	return f[19], true
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	_, state, ok := procStat(pid)
	return ok && state != 'Z' && state != 'X'
}

// waitGone waits until none of pids is alive (a zombie has already released
// its memory and shared-memory attachments, so it counts as gone).
func waitGone(pids []int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var left []int
		for _, p := range pids {
			if alive(p) {
				left = append(left, p)
			}
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgserver: processes %v still alive after %v", left, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// killTree SIGKILLs the postmaster pid and every child it has, without
// letting the postmaster react in between (it is stopped first, so it can
// neither fork nor start crash recovery), and waits until they are gone.
// It does not reap pid: the caller's Wait goroutine does.
func killTree(pid int) error {
	_ = syscall.Kill(pid, syscall.SIGSTOP)
	waitStopped(pid)
	kids := children(pid)
	_ = syscall.Kill(-pid, syscall.SIGKILL) // the postmaster's own group
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for _, k := range kids {
		// Each child leads its own session and group (archive_command
		// shells and the like live there): kill the group, then the pid.
		_ = syscall.Kill(-k, syscall.SIGKILL)
		_ = syscall.Kill(k, syscall.SIGKILL)
	}
	return waitGone(append(kids, pid), 30*time.Second)
}

// signalTree sends sig to the postmaster and all its children. For SIGSTOP
// the postmaster goes first (so it forks nothing new); for anything else it
// goes last.
func signalTree(pid int, sig syscall.Signal) error {
	if sig == syscall.SIGSTOP {
		if err := syscall.Kill(pid, sig); err != nil {
			return err
		}
		waitStopped(pid)
	}
	for _, k := range children(pid) {
		_ = syscall.Kill(k, sig)
	}
	if sig != syscall.SIGSTOP {
		return syscall.Kill(pid, sig)
	}
	return nil
}

// waitStopped waits briefly until pid is in the stopped state, so that a
// fork it was in the middle of has finished and the child is visible.
func waitStopped(pid int) {
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		_, state, ok := procStat(pid)
		if !ok || state == 'T' || state == 't' || state == 'Z' {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// shmSeg identifies a System V shared-memory segment: PostgreSQL's key, the
// kernel's id (which the kernel may hand out again once removed) and the pid
// of the postmaster that created it.
type shmSeg struct {
	key, id int64
	creator int
}

// pidFile is what the harness needs from postmaster.pid.
type pidFile struct {
	pid int
	shm shmSeg // id -1 if unknown
}

// readPidFile parses <dataDir>/postmaster.pid: line 1 is the postmaster
// pid, line 7 "key shmid" of its System V shared-memory segment.
func readPidFile(dataDir string) (pidFile, bool) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return pidFile{}, false
	}
	lines := strings.Split(string(b), "\n")
	pf := pidFile{shm: shmSeg{id: -1}}
	pf.pid, err = strconv.Atoi(strings.TrimSpace(lines[0]))
	if err != nil {
		return pidFile{}, false
	}
	if len(lines) >= 7 {
		if f := strings.Fields(lines[6]); len(f) == 2 {
			key, err1 := strconv.ParseInt(f[0], 10, 64)
			id, err2 := strconv.ParseInt(f[1], 10, 64)
			if err1 == nil && err2 == nil {
				pf.shm = shmSeg{key: key, id: id, creator: pf.pid}
			}
		}
	}
	return pf, true
}

// removeShm removes segment seg if it still exists with the same key and
// creator (so a reused id or another server's segment is never touched). The
// creator must be dead. Backends of a postmaster that died may still be
// attached for a moment: the kernel then frees the segment at the last
// detach.
func removeShm(seg shmSeg) error {
	if seg.id < 0 {
		return nil
	}
	key, creator, ok := shmInfo(seg.id)
	if !ok || key != seg.key || creator != seg.creator || alive(creator) {
		return nil
	}
	const ipcRmid = 0
	if _, _, errno := syscall.Syscall(syscall.SYS_SHMCTL, uintptr(seg.id), ipcRmid, 0); errno != 0 {
		if errno == syscall.EINVAL || errno == syscall.EIDRM {
			return nil
		}
		return fmt.Errorf("pgserver: removing shared-memory segment %d: %w", seg.id, errno)
	}
	return nil
}

// shmInfo returns the key and creator pid of segment id from
// /proc/sysvipc/shm (columns: key shmid perms size cpid lpid nattch ...).
func shmInfo(id int64) (key int64, cpid int, ok bool) {
	b, err := os.ReadFile("/proc/sysvipc/shm")
	if err != nil {
		return 0, 0, false
	}
	want := strconv.FormatInt(id, 10)
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 6 && f[1] == want {
			key, err1 := strconv.ParseInt(f[0], 10, 64)
			cpid, err2 := strconv.Atoi(f[4])
			return key, cpid, err1 == nil && err2 == nil
		}
	}
	return 0, 0, false
}

// shmExists reports whether segment id exists.
func shmExists(id int64) bool {
	_, _, ok := shmInfo(id)
	return ok
}

// Temporary directories are named dirPrefix + random and hold an ownerFile
// naming the process (pid and start time) that created them.
const (
	dirPrefix = "pgtest-"
	ownerFile = "owner"
)

func ownerStamp() string {
	st, _ := procStartTime(os.Getpid())
	return fmt.Sprintf("%d %s\n", os.Getpid(), st)
}

var swept sync.Map // parent directory → struct{}: swept by this process

// sweepStale removes what earlier test processes that died without
// cleaning up (SIGKILL, os.Exit, a test timeout) left in parent: their
// postmaster and children, shared memory and directories. Directories of
// live processes are left alone.
func sweepStale(parent string) {
	entries, err := os.ReadDir(parent)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), dirPrefix) {
			continue
		}
		root := filepath.Join(parent, e.Name())
		b, err := os.ReadFile(filepath.Join(root, ownerFile))
		if err != nil {
			continue // not ours, or being created right now
		}
		f := strings.Fields(string(b))
		if len(f) != 2 {
			continue
		}
		pid, err := strconv.Atoi(f[0])
		if err != nil {
			continue
		}
		if st, ok := procStartTime(pid); ok && st == f[1] {
			continue // owner alive
		}
		_ = cleanupDir(root)
	}
}

// cleanupDir kills a server still running from root/data, removes its shared
// memory and removes root.
func cleanupDir(root string) error {
	dataDir := filepath.Join(root, "data")
	var errs []error
	if pf, ok := readPidFile(dataDir); ok {
		if alive(pf.pid) && isPostmasterOf(pf.pid, dataDir) {
			errs = append(errs, killTree(pf.pid))
		}
		errs = append(errs, removeShm(pf.shm))
	}
	if err := os.RemoveAll(root); err != nil {
		errs = append(errs, fmt.Errorf("pgserver: removing %s: %w", root, err))
	}
	return errors.Join(errs...)
}

// isPostmasterOf checks that pid is a postgres process whose command line
// names dataDir, so a reused pid is never killed.
func isPostmasterOf(pid int, dataDir string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	return bytes.Contains(b, []byte(dataDir))
}

// KillTree crashes a postmaster that this package did not start (one that an
// HA manager runs): it stops pid, SIGKILLs it and every child at once and
// waits until they are gone. Reaping pid is its parent's business.
func KillTree(pid int) error { return killTree(pid) }

// SignalTree sends sig to a postmaster and all its children, in the order
// Freeze and Thaw use (SIGSTOP: the postmaster first).
func SignalTree(pid int, sig syscall.Signal) error { return signalTree(pid, sig) }

// PostmasterPID returns the pid that dataDir/postmaster.pid names, or 0.
func PostmasterPID(dataDir string) int {
	pf, ok := readPidFile(dataDir)
	if !ok || !alive(pf.pid) {
		return 0
	}
	return pf.pid
}
