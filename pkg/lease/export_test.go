package lease

import "context"

// Warm runs WarmConn's calls on key through c and returns the first error.
func Warm(ctx context.Context, c *Client, key string) error { return warm(ctx, c, key) }
