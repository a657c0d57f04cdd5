// Package bridgepipe joins two connections, for both ends of the konnector's
// network-namespace bridge (the test process and netbridge), which must
// behave alike. It imports nothing of testing, so netbridge stays small.
package bridgepipe

import (
	"io"
	"net"
)

// Pipe copies both ways until both directions are done, passing on
// half-closes so request/response protocols end cleanly.
func Pipe(a, b net.Conn) {
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(b, a)
		closeWrite(b)
		close(done)
	}()
	_, _ = io.Copy(a, b)
	closeWrite(a)
	<-done
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}
