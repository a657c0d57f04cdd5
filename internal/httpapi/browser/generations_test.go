package browser

import (
	"github.com/kbprovider/backend/internal/httpapi/mount"
	"github.com/kbprovider/backend/internal/sessions/lifecycle"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"

	// The generations register their renderers.
	_ "github.com/kbprovider/backend/internal/httpapi/v1alpha1"
	_ "github.com/kbprovider/backend/internal/httpapi/v1alpha2"
)

// callbackSession issues a session of the v1alpha1 callback flow.
func callbackSession(svc *lifecycle.Service, callbackURL, cliSession string) lifecycle.Session {
	sess, _, _ := svc.CreateSession(lifecycle.SessionRequest{Flow: sessionkey.FlowCallback, CallbackURL: callbackURL, CallbackSessionID: cliSession})
	return sess
}

// routes are the routes h mounts.
func routes(h mount.Part) []mount.Route {
	var c collected
	h.Mount(&c)
	return c
}

type collected []mount.Route

func (c *collected) Handle(rt mount.Route) { *c = append(*c, rt) }
