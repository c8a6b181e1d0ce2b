package lease

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"unicode/utf8"
)

// maxText is the longest key or owner the server accepts, in bytes.
const maxText = 1024

// CheckKey applies the server's rule for a key before anything is sent. A
// key is 1 to 1024 bytes of UTF-8 text. It holds no NUL byte and no control
// character (U+0001 to U+001F, U+007F). The error matches ErrInvalidInput.
func CheckKey(key string) error { return checkText("key", key) }

// CheckOwner applies the key rule (CheckKey) to an owner, the identity a
// holder presents.
func CheckOwner(owner string) error { return checkText("owner", owner) }

func checkText(what, v string) error {
	var problem string
	switch {
	case v == "":
		problem = "must not be empty"
	case len(v) > maxText:
		problem = fmt.Sprintf("must be at most %d bytes, got %d", maxText, len(v))
	case !utf8.ValidString(v) || strings.ContainsRune(v, 0):
		problem = "must be UTF-8 text without NUL bytes"
	case strings.ContainsFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		problem = "must not contain control characters (U+0001 to U+001F, U+007F)"
	default:
		return nil
	}
	return fmt.Errorf("%w: %s %s", ErrInvalidInput, what, problem)
}

// DefaultOwner is the owner a holder presents unless told otherwise:
// hostname-PID-random, unique to this process incarnation. A restarted
// process is a new owner: it cannot renew its predecessor's grant.
func DefaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}
