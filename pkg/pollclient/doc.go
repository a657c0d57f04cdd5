// Package pollclient is the consumer side of the kube-bind poll flow
// (docs/protocol.md): it reads a provider's discovery document, opens a
// session, builds the signed URL the user opens in any browser, and polls
// until the provider hands over the BindingResponse.
//
// Unlike the callback flow of released kube-bind CLIs, nothing listens on the
// consumer's machine, so the flow works over SSH and from headless hosts:
//
//	c := pollclient.New(nil)
//	p, err := c.Discover(ctx, "https://bind.example.com/export")
//	s, err := c.CreateSession(ctx, p, previousClusterID) // "" for a new one
//	u, err := s.AuthenticationURL()                       // show this to the user
//	res, err := s.Wait(ctx)                               // res.Response is the BindingResponse
//
// Terminal answers of the provider end Wait with an error that errors.Is
// matches against ErrAccessDenied, ErrInvalidSignature, ErrExpired or
// ErrInvalidRequest; a *ServerError carries the provider's own message.
// Network errors and 5xx answers are retried with backoff until the context
// ends or the session expires.
//
// The session secret never leaves the Session value: it keys the signatures
// and is left out of every string, log and progress report the package makes.
package pollclient
