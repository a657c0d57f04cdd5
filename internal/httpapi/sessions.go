package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"

	"github.com/kbprovider/backend/internal/sessions/sessionkey"
	"github.com/kbprovider/backend/pkg/apis/v1alpha1"
	v1alpha2 "github.com/kbprovider/backend/pkg/apis/v1alpha2"
)

// createSession is POST /sessions (§1). The body is empty or
// {"clusterID": "..."}; lifecycle.CreatePollSession settles the cluster
// ID (a new one with its cluster secret, or the presented one, used only
// if the authentication URL proves it). Malformed JSON, a value that is
// not a string, an unknown field or
// trailing data is a 400, so that a typo such as "cluster" does not
// silently cost the client its identity. (Field names match
// case-insensitively, as encoding/json does: "clusterId" is accepted.)
func (s *server) createSession(w http.ResponseWriter, r *http.Request) {
	s.createSessionOf(w, r, sessionkey.FlowPoll, v1alpha1.GroupVersion)
}

// createSessionV1alpha2 is POST /api/sessions: the same session, of the
// v1alpha2 poll flow (docs/v1alpha2.md §2.6), labelled kube-bind.io/v1alpha2.
func (s *server) createSessionV1alpha2(w http.ResponseWriter, r *http.Request) {
	s.createSessionOf(w, r, sessionkey.FlowPollV1alpha2, v1alpha2.GroupVersion)
}

func (s *server) createSessionOf(w http.ResponseWriter, r *http.Request, flow sessionkey.Flow, apiVersion string) {
	body, tooLarge, err := readBody(w, r, maxSessionBody)
	switch {
	case tooLarge:
		writeError(w, http.StatusRequestEntityTooLarge, errRequestTooLarge, tooLargeMessage(maxSessionBody))
		return
	case err != nil:
		writeError(w, http.StatusBadRequest, v1alpha1.ErrorInvalidRequest, "the request body could not be read: "+err.Error())
		return
	}
	req, err := decodeCreateSession(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, v1alpha1.ErrorInvalidRequest,
			`the body must be empty or {"clusterID": "<id>"}: `+err.Error())
		return
	}
	// Nothing is stored: the session is derived from keys, so creating
	// one costs no memory and cannot fail.
	sess, clusterID, clusterSecret := s.bind.CreatePollSessionOf(flow, req.ClusterID)
	s.metrics.sessionsCreated.Inc()
	writeJSON(w, http.StatusCreated, v1alpha1.PollSession{
		APIVersion:    apiVersion,
		Kind:          v1alpha1.KindPollSession,
		SessionID:     sess.ID,
		ClusterID:     clusterID,
		SessionSecret: sess.Secret,
		ExpiresAt:     sess.ExpiresAt.UTC().Truncate(1e9),
		ClusterSecret: clusterSecret,
	})
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
