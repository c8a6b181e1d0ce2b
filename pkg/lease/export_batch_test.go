package lease

import (
	"context"
	"time"
)

// CommitUnknownError lets tests reach the call and warning an
// ErrCommitUnknown error carries.
type CommitUnknownError = commitUnknownError

// RenewResult and RenewMany expose the batch renewal under RenewTerms.
type RenewResult = renewResult

func (c *Client) RenewMany(ctx context.Context, ts []Token, ttl time.Duration) ([]RenewResult, error) {
	return c.renewMany(ctx, ts, ttl)
}
