// SPDX-License-Identifier: Apache-2.0

package metrics

import (
	"bytes"
	"compress/gzip"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
)

// DefaultInterval is how often the agent collects its metrics. A scrape
// is served from the last collection, so a Prometheus that scrapes every
// 15 s to 1 min (its default) sees data at most this old, and however
// many scrapes arrive, each stack is asked for its status once per
// interval.
const DefaultInterval = 10 * time.Second

// Cache gathers a registry on its own schedule and serves the last
// rendering: what a scrape costs the agent is writing bytes it already
// has, and what it costs the node's stacks is nothing.
type Cache struct {
	g        prometheus.Gatherer
	interval time.Duration
	log      *slog.Logger
	// after runs after each collection (the agent learns the pod
	// network from the attachments there); nil: nothing.
	after func()

	cur   atomic.Pointer[rendering]
	ready chan struct{} // closed once the first rendering is in cur
	once  sync.Once

	collections atomic.Uint64
}

// rendering is one collection in the text exposition format, plain and
// gzipped (what Prometheus asks for), each made once.
type rendering struct {
	plain, gz []byte
}

var textFormat = expfmt.NewFormat(expfmt.TypeTextPlain)

// NewCache returns a cache of g's metrics, collected every interval (zero:
// DefaultInterval) once Run runs; after, when not nil, runs after each
// collection.
func NewCache(g prometheus.Gatherer, interval time.Duration, after func(), log *slog.Logger) *Cache {
	if interval <= 0 {
		interval = DefaultInterval
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Cache{g: g, interval: interval, after: after, log: log, ready: make(chan struct{})}
}

// Collections is how many collections the cache made.
func (c *Cache) Collections() uint64 { return c.collections.Load() }

// Run collects at once and then every interval, until ctx ends.
func (c *Cache) Run(ctx context.Context) {
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for {
		c.Collect()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Collect gathers and renders once. A failing collector leaves out its
// series and is logged: the others are still served.
func (c *Cache) Collect() {
	fams, err := c.g.Gather()
	if err != nil {
		c.log.Warn("collecting metrics", "err", err)
	}
	var plain bytes.Buffer
	enc := expfmt.NewEncoder(&plain, textFormat)
	for _, f := range fams {
		if err := enc.Encode(f); err != nil {
			c.log.Warn("rendering metrics", "family", f.GetName(), "err", err)
		}
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(plain.Bytes())
	zw.Close()
	c.cur.Store(&rendering{plain: plain.Bytes(), gz: gz.Bytes()})
	c.collections.Add(1)
	c.once.Do(func() { close(c.ready) })
	if c.after != nil {
		c.after()
	}
}

// ServeHTTP writes the last collection; before the first one it waits
// for it, as long as the request lasts.
func (c *Cache) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	select {
	case <-c.ready:
	case <-r.Context().Done():
		http.Error(w, "no metrics collected yet", http.StatusServiceUnavailable)
		return
	}
	cur := c.cur.Load()
	body := cur.plain
	h := w.Header()
	h.Set("Content-Type", string(textFormat))
	h.Add("Vary", "Accept-Encoding")
	if acceptsGzip(r.Header.Get("Accept-Encoding")) {
		h.Set("Content-Encoding", "gzip")
		body = cur.gz
	}
	w.Write(body)
}

func acceptsGzip(header string) bool {
	for _, part := range strings.Split(header, ",") {
		enc, _, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(enc), "gzip") {
			return true
		}
	}
	return false
}
