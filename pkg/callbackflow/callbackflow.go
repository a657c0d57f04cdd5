// Package callbackflow is the consumer side of kube-bind's callback flow
// (method OAuth2CodeGrant), the one every released v1alpha1 provider
// offers: the client listens on a loopback port, the user opens the
// provider's authenticatedURL with the client's session ID (s), cluster ID
// (c) and port (p), and after the login the browser is redirected to
// http://localhost:<p>/callback?response=<BindingResponse in standard
// base64>.
//
// It needs a browser on the same machine as the client; the poll flow
// (package pollclient) does not.
//
//	f, err := callbackflow.Start(authenticatedURL, clusterID)
//	defer f.Close()
//	fmt.Println(f.URL())       // show this to the user
//	res, err := f.Wait(ctx)    // res.Response is the BindingResponse
package callbackflow

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
	"github.com/kbprovider/backend/pkg/pollclient"
)

// maxResponse bounds the response parameter (a BindingResponse with a
// kubeconfig is a few KiB).
const maxResponse = 1 << 20

// Flow is a running callback listener for one binding.
type Flow struct {
	sessionID string
	url       string
	servers   []*http.Server
	wg        sync.WaitGroup
	results   chan *pollclient.Result
	closeOnce sync.Once
}

// Start listens on a free port of 127.0.0.1 (and the same port of ::1 when
// the host has IPv6 loopback, as browsers may resolve localhost to
// either) and builds the URL to open: authenticatedURL with c, p and s
// added (its own query kept).
func Start(authenticatedURL *url.URL, clusterID string) (*Flow, error) {
	if authenticatedURL == nil || clusterID == "" {
		return nil, errors.New("callbackflow: Start needs the authenticatedURL and a cluster ID")
	}
	sid, err := newSessionID()
	if err != nil {
		return nil, err
	}
	l4, err := net.Listen("tcp", "127.0.0.1:0") //nolint:noctx // binding a loopback port does not block; nothing to cancel
	if err != nil {
		return nil, fmt.Errorf("listening for the callback: %w", err)
	}
	port := l4.Addr().(*net.TCPAddr).Port
	listeners := []net.Listener{l4}
	if l6, err := net.Listen("tcp", net.JoinHostPort("::1", strconv.Itoa(port))); err == nil { //nolint:noctx // as above
		listeners = append(listeners, l6)
	}
	f := &Flow{sessionID: sid, results: make(chan *pollclient.Result, 1)}
	q, err := url.ParseQuery(authenticatedURL.RawQuery)
	if err != nil {
		for _, l := range listeners {
			l.Close()
		}
		return nil, fmt.Errorf("authenticatedURL: %w", err)
	}
	q.Set("c", clusterID)
	q.Set("p", strconv.Itoa(port))
	q.Set("s", sid)
	u := *authenticatedURL
	u.RawQuery = q.Encode() // sorted by key
	f.url = u.String()

	mux := http.NewServeMux()
	mux.HandleFunc("GET /callback", f.callback)
	for _, l := range listeners {
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		f.servers = append(f.servers, srv)
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			_ = srv.Serve(l)
		}()
	}
	return f, nil
}

// URL is what the user opens.
func (f *Flow) URL() string { return f.url }

// SessionID is the session ID the client made (s), which the response
// must carry.
func (f *Flow) SessionID() string { return f.sessionID }

// Wait waits for the browser to deliver a valid BindingResponse of this
// session, or for ctx to end.
func (f *Flow) Wait(ctx context.Context) (*pollclient.Result, error) {
	select {
	case res := <-f.results:
		return res, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Close stops listening and waits for the servers.
func (f *Flow) Close() {
	f.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, s := range f.servers {
			_ = s.Shutdown(ctx)
		}
		f.wg.Wait()
	})
}

// callback takes the response. Anything that is not a valid response of
// this session (another local program, a stale tab) gets a 400 page and
// the flow keeps waiting.
func (f *Flow) callback(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	raw := r.URL.Query().Get("response")
	if raw == "" || len(raw) > maxResponse {
		page(w, http.StatusBadRequest, "No binding response", "The link carries no response. Run the command again.")
		return
	}
	body, err := base64.StdEncoding.DecodeString(raw)
	if err != nil {
		page(w, http.StatusBadRequest, "Bad binding response", "The response is not standard base64.")
		return
	}
	var br v1alpha1.BindingResponse
	if err := json.Unmarshal(body, &br); err != nil {
		page(w, http.StatusBadRequest, "Bad binding response", "The response is not a BindingResponse.")
		return
	}
	res, err := pollclient.ValidateBindingResponse(&br, f.sessionID)
	if err != nil {
		page(w, http.StatusBadRequest, "Bad binding response", err.Error())
		return
	}
	res.Raw = body
	select {
	case f.results <- res:
		page(w, http.StatusOK, "Bound", "The command has the binding. Go back to the terminal; you can close this page.")
	default:
		page(w, http.StatusOK, "Already received", "The command has the binding already. Go back to the terminal.")
	}
}

func page(w http.ResponseWriter, status int, title, msg string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'none'")
	w.WriteHeader(status)
	fmt.Fprintf(w, "<!doctype html><meta charset=utf-8><title>%s</title><h1>%s</h1><p>%s</p>\n",
		html.EscapeString(title), html.EscapeString(title), html.EscapeString(msg))
}

func newSessionID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b[:]), nil
}
