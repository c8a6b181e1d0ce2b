// Package pgserver runs throwaway PostgreSQL servers for tests, benchmarks
// and demos: real servers (initdb into a temporary directory), never mocks.
// It imports neither testing nor goleak, so programs (cmd/pglease-demo, the
// benchmarks) link it; tests use internal/pgtest, the testing layer on top
// (pgtest.New, NewDatabase, Main with goleak, the shared helpers).
//
// Programs use Start and Close:
//
//	s, err := pgserver.Start(ctx, pgserver.Options{})
//	if err != nil { ... }
//	defer s.Close()
//	if err := s.InstallExtensionFiles(ctx); err != nil { ... }
//	dsn, err := s.NewDatabase(ctx) // or CreateDatabase(ctx, "demo")
//
// and control the server:
//
//	s.Kill()                 // SIGKILL postmaster and every backend, reap
//	s.Start(ctx)             // again on the same data directory: crash recovery
//	s.Stop(); s.Restart(ctx) // fast shutdown; stop and start
//	s.Freeze(); s.Thaw()     // SIGSTOP / SIGCONT every server process
//	s.SetClockOffset(30 * time.Second) // the server's wall clock, live (Options.FakeClock)
//
// Shared returns one server per process (the external server of
// PGLEASE_TEST_DSN when set); control methods on it or on an external
// server return an error wrapping ErrNeedsThrowaway that says so.
//
// # What a throwaway server is
//
// Binaries: Options.BinDir, else $PGLEASE_PG_BINDIR (the caller sets
// LD_LIBRARY_PATH for binaries that need it), else `pg_config --bindir`,
// else the newest /usr/lib/postgresql/*/bin, else PATH. Without any, the
// error says to run `apt-get install postgresql`.
//
// PostgreSQL refuses to run as root, so when this process is root initdb and
// postgres run as nobody:nogroup, and the temporary directory belongs to
// that user. The binaries (and every directory above them) must then be
// readable by that user: a cache under /root (mode 0700) is not; Start says
// so. Options.Dir must be searchable by that user too.
//
// The cluster is created with `initdb -E UTF8 --locale=C -U postgres -A trust`
// (no password; Superuser is "postgres"), and listens on 127.0.0.1 at a free
// port and on a private socket directory (SocketDSN). Defaults written to
// postgresql.conf: shared_buffers=32MB, dynamic_shared_memory_type=mmap (so
// a killed server leaves nothing in /dev/shm), timezone=UTC; fsync and
// everything else keep PostgreSQL's defaults. Options.Settings override them.
// The server log is LogPath(); pgtest.New logs its tail when a test fails.
//
// The temporary directory holds:
//
//	pgtest-XXXX/owner        pid and start time of the process that owns it
//	pgtest-XXXX/data/        the cluster
//	pgtest-XXXX/sock/        the Unix socket
//	pgtest-XXXX/postgres.log server output, every start appended
//	pgtest-XXXX/faketime     the clock offset libfaketime reads (FakeClock)
//
// # Processes and crashes
//
// The postmaster is a child of this process in a process group of its own,
// with a parent-death signal (SIGKILL), and a goroutine waits on it, so a
// killed postmaster is reaped at once and never lingers as a zombie whose pid
// keeps postmaster.pid "in use". Backends are children of the postmaster but
// each leads its own session, so Kill and Freeze find them through /proc
// (parent pid): Kill stops the postmaster (so it forks nothing and starts no
// recovery), SIGKILLs it and all its children at once, and waits until they
// are gone, so nothing is written after the kill and the next Start finds the
// shared-memory segment detached.
//
// Close kills whatever runs, removes the System V shared-memory segments the
// server used (their ids are read from postmaster.pid, which a killed
// postmaster leaves behind) and the directory. If the test process itself
// dies without cleanup (test timeout, SIGKILL), the kernel kills the
// postmaster (its backends follow), and the next Start in that directory's
// parent finds the directory whose owner is dead and removes it with its
// segment. (The parent-death signal follows the OS thread that started the
// postmaster; Go keeps threads alive unless a goroutine exits while locked
// to one with runtime.LockOSThread, so do not start servers from such a
// goroutine.)
//
// # Fake clock
//
// Options.FakeClock runs the server with LD_PRELOAD=libfaketime.so.1
// (`apt-get install faketime`; or set PGLEASE_LIBFAKETIME),
// FAKETIME_TIMESTAMP_FILE pointing at the faketime file, FAKETIME_NO_CACHE=1
// (every clock call re-reads the file) and FAKETIME_DONT_FAKE_MONOTONIC=1
// (timeouts and sleeps stay real). SetClockOffset replaces the file
// atomically with a relative offset ("+30", "-10.5": seconds from real time),
// which every backend sees on its next clock reading.
//
// # Extension files
//
// InstallExtensionFiles copies pgleasesql.Files() into the installation's
// extension directory (pg_config --sharedir next to the binaries, else the
// server's pg_config view), rewriting only files that differ, each with an
// atomic rename. It needs write access there, which root has.
package pgserver
