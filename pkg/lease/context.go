package lease

import "context"

type tokenKey struct{}

// ContextWithToken returns a context that carries the fencing token t. The
// elector and the controller-runtime reconciler wrapper hand such contexts to
// code that acts under a grant; guards read the token back with
// TokenFromContext.
func ContextWithToken(ctx context.Context, t Token) context.Context {
	return context.WithValue(ctx, tokenKey{}, t)
}

// TokenFromContext returns the fencing token carried by ctx, if any.
func TokenFromContext(ctx context.Context) (Token, bool) {
	t, ok := ctx.Value(tokenKey{}).(Token)
	return t, ok
}
