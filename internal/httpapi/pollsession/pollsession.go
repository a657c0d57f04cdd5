// Package pollsession creates the sessions of the poll flow (protocol §3)
// for every generation that has one: POST /sessions of v1alpha1 and POST
// /api/sessions of v1alpha2 create the same session, each of its own
// flow, labelled with its own API version. The polls of both are GET
// /poll (internal/httpapi).
package pollsession

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kbprovider/backend/internal/httpapi/respond"
	"github.com/kbprovider/backend/internal/sessions/lifecycle"
	"github.com/kbprovider/backend/internal/sessions/sessionkey"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
)

// DefaultPollInterval is the poll interval advertised when none is
// configured.
const DefaultPollInterval = 2 * time.Second

// MaxBody is the most a POST /sessions body may hold (§1).
const MaxBody = 4 << 10

// Creator creates poll sessions.
type Creator struct {
	svc     *lifecycle.Service
	created prometheus.Counter
}

// New returns the Creator of svc's poll sessions; its counter of created
// sessions is registered in reg (nil: not registered).
func New(svc *lifecycle.Service, reg prometheus.Registerer) (*Creator, error) {
	if svc == nil {
		return nil, errors.New("pollsession: a session service is required")
	}
	c := &Creator{svc: svc, created: prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "kube_bind_backend", Name: "sessions_created_total", Help: "Poll sessions created."})}
	if reg != nil {
		if err := reg.Register(c.created); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Handler is the POST that creates a session of flow, answered as a
// PollSession of apiVersion. The body is empty or {"clusterID": "..."};
// lifecycle.CreateSession settles the cluster ID (a new one with its
// cluster secret, or the presented one, used only if the authentication
// URL proves it). Malformed JSON, a value that is not a string, an
// unknown field or trailing data is a 400, so that a typo such as
// "cluster" does not silently cost the client its identity. (Field names
// match case-insensitively, as encoding/json does: "clusterId" is
// accepted.)
func (c *Creator) Handler(flow sessionkey.Flow, apiVersion string) http.HandlerFunc {
	if !flow.Polled() {
		panic("pollsession: a handler for a flow that is not polled")
	}
	return func(w http.ResponseWriter, r *http.Request) {
		body, tooLarge, err := respond.ReadBody(w, r, MaxBody)
		switch {
		case tooLarge:
			respond.Error(w, http.StatusRequestEntityTooLarge, respond.ErrRequestTooLarge, respond.TooLargeMessage(MaxBody))
			return
		case err != nil:
			respond.Error(w, http.StatusBadRequest, v1alpha1.ErrorInvalidRequest, "the request body could not be read: "+err.Error())
			return
		}
		req, err := decodeCreateSession(body)
		if err != nil {
			respond.Error(w, http.StatusBadRequest, v1alpha1.ErrorInvalidRequest,
				`the body must be empty or {"clusterID": "<id>"}: `+err.Error())
			return
		}
		// Nothing is stored: the session is derived from keys, so
		// creating one costs no memory and cannot fail.
		sess, clusterID, clusterSecret := c.svc.CreateSession(lifecycle.SessionRequest{Flow: flow, ClusterID: req.ClusterID})
		c.created.Inc()
		respond.JSON(w, http.StatusCreated, v1alpha1.PollSession{
			APIVersion:    apiVersion,
			Kind:          v1alpha1.KindPollSession,
			SessionID:     sess.ID,
			ClusterID:     clusterID,
			SessionSecret: sess.Secret,
			ExpiresAt:     sess.ExpiresAt.UTC().Truncate(1e9),
			ClusterSecret: clusterSecret,
		})
	}
}

func decodeCreateSession(body []byte) (v1alpha1.CreateSessionRequest, error) {
	var req v1alpha1.CreateSessionRequest
	if len(bytes.TrimSpace(body)) == 0 {
		return req, nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, cleanJSONError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return req, errors.New("unexpected data after the JSON object")
	}
	return req, nil
}

// cleanJSONError says what is wrong with a body in JSON's words, never
// with the Go type names encoding/json puts into its errors.
func cleanJSONError(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		what := "the body"
		if te.Field != "" {
			what = "field " + te.Field
		}
		return errors.New(what + " must be " + jsonKind(te.Type) + ", not a JSON " + te.Value)
	}
	if msg, ok := strings.CutPrefix(err.Error(), "json: "); ok {
		return errors.New(msg)
	}
	return err
}

// jsonKind names what a Go type is in JSON.
func jsonKind(t reflect.Type) string {
	if t == nil {
		return "another JSON value"
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Pointer:
		return jsonKind(t.Elem())
	}
	return "a JSON object"
}
