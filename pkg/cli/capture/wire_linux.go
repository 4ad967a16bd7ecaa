package capture

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/cni-usernet/cni-usernet/pkg/api/pcap"
)

// wireStream is the stack's stream of the wire leg.
type wireStream struct {
	client  *http.Client
	body    io.ReadCloser
	resp    *http.Response
	id      string
	iface   int
	ifIndex uint32
	cancel  context.CancelFunc
	// Set when the stream ended with the stack's counts.
	complete bool
	sent     uint64
	dropped  uint64
}

func unixClient(path string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}}
}

func openWire(sock string, snapLen, iface int, ifIndex uint32) (*wireStream, error) {
	w := &wireStream{client: unixClient(sock), iface: iface, ifIndex: ifIndex}
	// The stream outlives the capture's context by stopGrace: it ends
	// when the stack has sent what it holds.
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://stack"+pcap.StreamPath+"?"+pcap.SnapLenQuery+"="+strconv.Itoa(snapLen), nil)
	if err != nil {
		cancel()
		return nil, err
	}
	resp, err := w.client.Do(req)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("asking the stack at %s for a capture: %w", sock, err)
	}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		cancel()
		if resp.StatusCode == http.StatusNotFound {
			// Stacks outlive agents: after an upgrade, a pod's stack can
			// still be one an earlier release started, before stacks had
			// a capture stream.
			return nil, fmt.Errorf("the stack at %s has no capture stream (%s): it runs an earlier release of cni-usernet, started before the upgrade; "+
				"when its process ends, the agent starts it again from the installed release, which can be captured", sock, pcap.StreamPath)
		}
		return nil, fmt.Errorf("the stack at %s refused the capture: %s: %s", sock, resp.Status, msg)
	}
	w.resp, w.body, w.id, w.cancel = resp, resp.Body, resp.Header.Get(pcap.HeaderID), cancel
	return w, nil
}

// run reads the stream until it ends; when ctx ends it asks the stack to
// stop and reads on until the stack's counts arrive.
func (w *wireStream) run(ctx context.Context, push func(pcap.Packet)) error {
	defer w.cancel()
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-done:
			return
		case <-ctx.Done():
		}
		req, _ := http.NewRequest(http.MethodPost, "http://stack"+pcap.StopPath+"?"+pcap.SessionIDForm+"="+w.id, nil)
		c := *w.client
		c.Timeout = stopGrace
		if resp, err := c.Do(req); err == nil {
			resp.Body.Close()
		}
		select {
		case <-done:
		case <-time.After(stopGrace):
			w.cancel()
		}
	}()
	pr, err := pcap.NewPcapReader(w.body)
	if err != nil {
		return fmt.Errorf("reading the stack's capture stream: %w", err)
	}
	for {
		p, err := pr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("the stack's capture stream broke off (the stack stopped or restarted?): %w", err)
		}
		pcap.SetIfIndex(p.Frame, w.ifIndex)
		p.Iface = w.iface
		push(p)
	}
	sent, err1 := strconv.ParseUint(w.resp.Trailer.Get(pcap.TrailerSent), 10, 64)
	dropped, err2 := strconv.ParseUint(w.resp.Trailer.Get(pcap.TrailerDrops), 10, 64)
	if err1 == nil && err2 == nil {
		w.complete, w.sent, w.dropped = true, sent, dropped
	}
	return nil
}
