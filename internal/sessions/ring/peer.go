package ring

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/golang/groupcache"
	pb "github.com/golang/groupcache/groupcachepb"

	"github.com/kbprovider/backend/internal/sessions"
)

const (
	outcomePath = "/_groupcache/" + wireGroup + "/"
	admitPath   = "/sessions-peer/v4/admit"
	// peerName is the DNS name in every peer certificate: peers are
	// reached by IP, and trust comes from the CA, not from the name.
	peerName = "kube-bind-peer"
	caInfo   = "kube-bind peer CA"
	// maxAdmitBody bounds an admit request and its answer.
	maxAdmitBody = 1 << 10
	// maxOutcomeBody bounds an outcome from a peer: a response of
	// sessions.DefaultLimits' size, base64 in JSON, fits.
	maxOutcomeBody = 1 << 20
)

// The CA certificate is built from fixed fields, so every replica derives
// the same one from a key (Ed25519 signatures are deterministic).
var (
	caNotBefore = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	caNotAfter  = time.Date(2120, 1, 1, 0, 0, 0, 0, time.UTC)
)

// deriveCA returns the CA of a peer key.
func deriveCA(key []byte) (*x509.Certificate, ed25519.PrivateKey, error) {
	seed, err := hkdf.Key(sha256.New, key, nil, caInfo, ed25519.SeedSize)
	if err != nil {
		return nil, nil, err
	}
	priv := ed25519.NewKeyFromSeed(seed)
	pub := priv.Public().(ed25519.PublicKey)
	skid := sha256.Sum256(pub) // set here, not left to the Go version
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: caInfo},
		NotBefore: caNotBefore, NotAfter: caNotAfter, SubjectKeyId: skid[:20],
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	if err != nil {
		return nil, nil, err
	}
	ca, err := x509.ParseCertificate(der)
	return ca, priv, err
}

// setupTLS makes this replica's certificate, signed by the current key's
// CA, and the TLS configurations and the client transport trusting every
// key's CA.
func (s *Store) setupTLS(keys [][]byte, now time.Time) error {
	pool := x509.NewCertPool()
	var ca *x509.Certificate
	var caKey ed25519.PrivateKey
	for i, k := range keys {
		c, priv, err := deriveCA(k)
		if err != nil {
			return fmt.Errorf("ring: peer CA: %w", err)
		}
		pool.AddCert(c)
		if i == 0 {
			ca, caKey = c, priv
		}
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return err
	}
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: peerName}, DNSNames: []string{peerName},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(1, 0, 0),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}, ca, pub, caKey)
	if err != nil {
		return fmt.Errorf("ring: peer certificate: %w", err)
	}
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: priv}
	s.serverTLS = &tls.Config{
		MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool,
	}
	s.transport = &http.Transport{
		TLSClientConfig: &tls.Config{
			MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert},
			RootCAs: pool, ServerName: peerName,
		},
		ForceAttemptHTTP2:     true,
		DialContext:           (&net.Dialer{Timeout: s.timeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   s.timeout,
		ResponseHeaderTimeout: s.timeout,
		MaxIdleConns:          64,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		// A connection to a frozen peer is closed after a failed ping.
		HTTP2: &http.HTTP2Config{SendPingTimeout: 10 * time.Second, PingTimeout: s.timeout},
	}
	s.server = &http.Server{
		Handler:           s.Handler(),
		TLSConfig:         s.ServerTLSConfig(),
		ReadHeaderTimeout: 5 * time.Second, // also bounds the TLS handshake
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    8 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	return nil
}

// ServerTLSConfig returns the TLS configuration of the peer listener:
// TLS 1.3, client certificates from a peer CA required.
func (s *Store) ServerTLSConfig() *tls.Config { return s.serverTLS.Clone() }

// Serve serves the peer API with TLS on ln until Shutdown.
func (s *Store) Serve(ln net.Listener) error {
	if err := s.server.ServeTLS(ln, "", ""); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Shutdown stops serving the peer API and closes idle peer connections.
func (s *Store) Shutdown(ctx context.Context) error {
	defer s.transport.CloseIdleConnections()
	return s.server.Shutdown(ctx)
}

// Handler serves the peer API. It refuses requests that did not come
// over TLS with a verified client certificate (ServerTLSConfig).
func (s *Store) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+outcomePath+"{key}", s.serveOutcome)
	mux.HandleFunc("POST "+admitPath, s.serveAdmit)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
			http.Error(w, "peer certificate required", http.StatusForbidden)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// serveOutcome answers a peer's groupcache Get: 200 with the outcome, 204
// when its record is gone.
func (s *Store) serveOutcome(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	if rec, id, ok := strings.Cut(key, keySep); !ok || rec == "" || id == "" || len(key) > maxGroupKeyLen {
		http.Error(w, "bad key", http.StatusBadRequest)
		return
	}
	var b []byte
	ctx := context.WithValue(r.Context(), loadStateKey{}, &loadState{fromPeer: true})
	switch err := s.group.Get(ctx, key, groupcache.AllocatingByteSliceSink(&b)); {
	case errors.Is(err, errPending):
		w.WriteHeader(http.StatusNoContent)
	case err != nil:
		s.log.Debug("outcome for a peer failed", "error", err)
		http.Error(w, "store unavailable", http.StatusServiceUnavailable)
	default:
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b)
	}
}

// peer is a replica's peer API as seen by this one.
type peer struct {
	s    *Store
	base string
}

var errNoForward = errors.New("ring: a peer's request is loaded locally")

// Get implements groupcache.ProtoGetter. Any error makes groupcache load
// locally instead.
func (p *peer) Get(ctx context.Context, in *pb.GetRequest, out *pb.GetResponse) error {
	st := stateOf(ctx)
	if st.fromPeer {
		// Peers disagreeing on the members must not bounce a request.
		return errNoForward
	}
	status, body, err := p.do(ctx, http.MethodGet, outcomePath+url.PathEscape(in.GetKey()), nil, maxOutcomeBody)
	switch {
	case err != nil:
		err = &unreachableError{reason: transportReason(err), err: err}
	case status == http.StatusNoContent:
		st.ownerPending = true
		return errPending
	case status != http.StatusOK:
		err = fmt.Errorf("peer answered %d", status)
	default:
		if _, err = decodeOutcome(body); err == nil {
			out.Value = body
			return nil
		}
	}
	p.s.fellBack(ctx, p.base, err)
	return err
}

// do sends one request to the peer, bounded by the peer timeout, and
// returns the status and the body of the answer.
func (p *peer) do(ctx context.Context, method, path string, body []byte, limit int64) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, p.s.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, p.base+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := p.s.transport.RoundTrip(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, limit+1))
	if err == nil && int64(len(b)) > limit {
		err = errors.New("peer answer too large")
	}
	return res.StatusCode, b, err
}

// admitRequest asks the owner to admit a poll.
type admitRequest struct {
	ID          string `json:"id"`
	Nonce       string `json:"nonce"`
	Expires     int64  `json:"expires"`     // Unix nanoseconds
	MinInterval int64  `json:"minInterval"` // nanoseconds
	// No time of the sender's clock: the owner decides on its own clock
	// alone (pace, expiry), so replicas whose clocks disagree agree on
	// every decision. A request that reaches the owner after its sender
	// stopped waiting (a frozen owner thawing, a path that held packets)
	// still counts: its nonce was admitted by the sender anyway, and its
	// poll time, later than the client's, can at worst make the next
	// poll wait once (429 with Retry-After within the interval).
}

// admitAnswer is the owner's decision: Result names one of admitResults,
// or is "tooSoon" with RetryAfter (nanoseconds, > 0).
type admitAnswer struct {
	Result     string `json:"result"`
	RetryAfter int64  `json:"retryAfter,omitempty"`
}

var admitResults = []struct {
	name string
	err  error
}{{"ok", nil}, {"nonceUsed", sessions.ErrNonceUsed}, {"tooManyNonces", sessions.ErrTooManyNonces}, {"sessionOver", sessions.ErrSessionOver}}

// decodeStrict decodes exactly one JSON object with known fields only.
func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the object")
	}
	return nil
}

func decodeAdmitRequest(b []byte) (admitRequest, error) {
	var r admitRequest
	if len(b) > maxAdmitBody {
		return r, errors.New("request too large")
	}
	if err := decodeStrict(b, &r); err != nil {
		return r, err
	}
	if r.ID == "" || len(r.ID) > maxKeyLen || len(r.Nonce) > maxKeyLen || r.Expires <= 0 || r.MinInterval < 0 {
		return admitRequest{}, errors.New("invalid admit request")
	}
	return r, nil
}

func (s *Store) serveAdmit(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxAdmitBody))
	var req admitRequest
	if err == nil {
		req, err = decodeAdmitRequest(b)
	}
	if err != nil {
		http.Error(w, "bad admit request", http.StatusBadRequest)
		return
	}
	if r.Context().Err() != nil {
		// The sender reset the request: it answers without us.
		return
	}
	err = s.inner.AdmitPoll(r.Context(), req.ID, req.Nonce, time.Unix(0, req.Expires), time.Duration(req.MinInterval))
	var a admitAnswer
	var soon *sessions.TooSoonError
	for _, res := range admitResults {
		if errors.Is(err, res.err) {
			a.Result = res.name
			break
		}
	}
	if a.Result == "" && errors.As(err, &soon) {
		a = admitAnswer{Result: "tooSoon", RetryAfter: int64(soon.RetryAfter)}
	}
	if a.Result == "" {
		s.log.Debug("admitting a peer's poll failed", "error", err)
		http.Error(w, "store unavailable", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(a)
}

// admit has the owner admit a poll. It returns the owner's answer, or an
// error when there is none: an *unreachableError when the owner could
// not be asked (the caller may decide without it), else the owner's
// failure to decide.
func (p *peer) admit(ctx context.Context, req admitRequest) (answer, err error) {
	body, err := json.Marshal(req)
	if err != nil || len(body) > maxAdmitBody || len(req.ID) > maxKeyLen || len(req.Nonce) > maxKeyLen {
		return nil, errors.New("poll too large to send")
	}
	status, body, err := p.do(ctx, http.MethodPost, admitPath, body, maxAdmitBody)
	if err != nil {
		return nil, &unreachableError{reason: transportReason(err), err: err}
	}
	if status == http.StatusNotFound {
		// A replica of another version, during a rolling update.
		return nil, &unreachableError{reason: reasonVersion, err: fmt.Errorf("peer answered %d to %s", status, admitPath)}
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("peer answered %d", status)
	}
	var a admitAnswer
	if err := decodeStrict(body, &a); err != nil {
		return nil, fmt.Errorf("peer answer: %w", err)
	}
	for _, res := range admitResults {
		if a.Result == res.name {
			return res.err, nil
		}
	}
	if a.Result == "tooSoon" && a.RetryAfter > 0 {
		return &sessions.TooSoonError{RetryAfter: time.Duration(a.RetryAfter)}, nil
	}
	return nil, fmt.Errorf("peer answered %q", a.Result)
}

// Why a peer request was answered locally: the label of
// ring_peer_fallback_reasons_total and the warning's reason.
const (
	reasonTimeout     = "timeout"     // no answer within the peer timeout
	reasonUnreachable = "unreachable" // no connection (refused, reset, no route)
	reasonRefusedTLS  = "tls"         // the TLS handshake failed: another peer key, or no peer
	reasonVersion     = "version"     // the peer does not serve this request (another version)
	reasonAnswer      = "answer"      // the peer answered with an error (outcome reads only)
)

// FallbackReasons are the reasons PeerFallbacksByReason counts.
var FallbackReasons = []string{reasonTimeout, reasonUnreachable, reasonRefusedTLS, reasonVersion, reasonAnswer}

// unreachableError: the owner could not be asked, for reason.
type unreachableError struct {
	reason string
	err    error
}

func (e *unreachableError) Error() string { return e.reason + ": " + e.err.Error() }
func (e *unreachableError) Unwrap() error { return e.err }

// transportReason names why a request got no answer.
func transportReason(err error) string {
	var netErr net.Error
	var alert tls.AlertError
	var verify *tls.CertificateVerificationError
	var unknownCA x509.UnknownAuthorityError
	// An alert the peer sent (it refused our certificate) comes from
	// crypto/tls as a *net.OpError "remote error" around an unexported type.
	var opErr *net.OpError
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return reasonTimeout
	case errors.As(err, &alert), errors.As(err, &verify), errors.As(err, &unknownCA),
		errors.As(err, &opErr) && opErr.Op == "remote error":
		return reasonRefusedTLS
	}
	return reasonUnreachable
}
