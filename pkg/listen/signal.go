package listen

// signal names a step of a Waiter, reported to a test hook (see
// export_test.go) so that tests sequence on steps rather than sleeps. It is
// an integer type: a misspelt signal does not compile.
type signal int

const (
	sigListening         signal = iota + 1 // the connection listens (again)
	sigConnectFailed                       // detail: the error
	sigConnLost                            // detail: the error
	sigBadPayload                          // detail: the payload
	sigNotified                            // detail: the key; before it is dispatched
	sigListen                              // detail: the key; lease.listen committed
	sigUnlisten                            // detail: the key; lease.unlisten committed
	sigListenLocked                        // detail: the key; lease.listen hit lock_timeout (retried)
	sigListenAll                           // detail: the key beyond the server's bound: '*' registered
	sigListenFailed                        // detail: key and error
	sigUnlistenFailed                      // detail: key and error
	sigListenUnsupported                   // detail: the error (no lease.listen on the server)
	sigReadShared                          // detail: the key; an Await joined another's read
	sigAcquireShared                       // detail: the key; an AwaitAcquire joined another's acquire
	sigRegisterSlow                        // a Watch stopped waiting for its registration
)

var signalNames = [...]string{
	sigListening: "listening", sigConnectFailed: "connect_failed", sigConnLost: "conn_lost",
	sigBadPayload: "bad_payload", sigNotified: "notified", sigListen: "listen", sigUnlisten: "unlisten",
	sigListenLocked: "listen_locked", sigListenAll: "listen_all", sigListenFailed: "listen_failed",
	sigUnlistenFailed: "unlisten_failed", sigListenUnsupported: "listen_unsupported",
	sigReadShared: "read_shared", sigAcquireShared: "acquire_shared", sigRegisterSlow: "register_slow",
}

func (s signal) String() string {
	if s > 0 && int(s) < len(signalNames) {
		return signalNames[s]
	}
	return "signal(?)"
}

// hook receives a Waiter's signals (tests). One that blocks holds the
// Waiter there; read_shared, acquire_shared and register_slow run on the
// caller's goroutine.
type hook func(s signal, detail string)

func (h hook) emit(s signal, detail string) {
	if h != nil {
		h(s, detail)
	}
}
