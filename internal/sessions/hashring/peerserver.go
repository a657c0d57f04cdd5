package hashring

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// PeerServer serves a ring's peer API on a listener of its own (the
// --peer-listen-address): the public routes are never served there, and
// the peer API never on the public listener.
type PeerServer struct {
	srv       *http.Server
	ln        net.Listener
	receivers *receivers
}

// ListenPeers listens on addr for the peer API of s, so that a port in use
// fails at start-up; it serves nothing until Serve.
func (s *Store) ListenPeers(addr string, log *slog.Logger) (*PeerServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("peer API: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &PeerServer{ln: ln, receivers: s.receivers, srv: &http.Server{
		Handler:           s.PeerHandler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}}, nil
}

// Addr is the address the peer API listens on.
func (p *PeerServer) Addr() net.Addr { return p.ln.Addr() }

// Serve serves the peer API until Shutdown or Close; it returns nil then,
// else why it stopped.
func (p *PeerServer) Serve() error {
	if err := p.srv.Serve(p.ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("peer API: %w", err)
	}
	return nil
}

// Shutdown stops the peer API after its in-flight requests: it stops
// listening, and asks the replicas that send on streams to stop, then
// waits for them to close their streams once answered. Call it after the
// public server stopped: until then, other replicas may still forward
// requests for the sessions this one owns.
func (p *PeerServer) Shutdown(ctx context.Context) error {
	err := p.srv.Shutdown(ctx)
	if serr := p.receivers.shutdown(ctx); err == nil {
		err = serr
	}
	return err
}

// Close stops the peer API at once (also when it never served).
func (p *PeerServer) Close() {
	p.srv.Close()
	p.ln.Close()
	p.receivers.close()
}
