package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"
)

// Kind is a collection of API objects, as a list or a watch names it.
type Kind struct {
	// Group is the API group, "" for the core group.
	Group, Version string
	// Resource is the plural resource name, as RBAC rules write it.
	Resource string
}

// The collections the node agent watches for NetworkPolicy.
var (
	NetworkPolicies = Kind{"networking.k8s.io", "v1", "networkpolicies"}
	Pods            = Kind{"", "v1", "pods"}
	Namespaces      = Kind{"", "v1", "namespaces"}
	Services        = Kind{"", "v1", "services"}
	EndpointSlices  = Kind{"discovery.k8s.io", "v1", "endpointslices"}
)

func (k Kind) String() string {
	if k.Group == "" {
		return k.Resource
	}
	return k.Resource + "." + k.Group
}

// path is the cluster-wide collection's path.
func (k Kind) path() string {
	if k.Group == "" {
		return "/api/" + k.Version + "/" + k.Resource
	}
	return "/apis/" + k.Group + "/" + k.Version + "/" + k.Resource
}

// Meta is what a reflector keys its cache by and resumes its watch from.
type Meta struct {
	Namespace, Name, ResourceVersion string
}

// Key is "namespace/name", or the name of an object outside namespaces.
func (m Meta) Key() string {
	if m.Namespace == "" {
		return m.Name
	}
	return m.Namespace + "/" + m.Name
}

// ReflectorOptions configure a Reflector.
type ReflectorOptions[T any] struct {
	// Client reaches the API server. Required.
	Client *Client
	// Kind is the collection, listed and watched in all namespaces.
	// Required.
	Kind Kind
	// Meta gives an object's metadata. Required.
	Meta func(*T) Meta
	// OnChange is called, outside any lock, for each object the cache
	// changed: old nil is an object added, new nil one deleted, both set
	// one replaced. After a list (the first, or one after the watch
	// expired) it is called once per object added, changed (another
	// ResourceVersion) or deleted relative to the cache before the list,
	// none for the others. Calls come in the order of the changes, from
	// one goroutine; the objects are the cache's (never changed, do not
	// change them). It must not block. Nil: no call.
	OnChange func(old, new *T)
	// Log receives the reflector's errors, at most one line per
	// LogEvery (with the count of those left out). Nil: slog.Default.
	Log *slog.Logger
	// LogEvery bounds the error lines. Zero: 30 s.
	LogEvery time.Duration
	// Backoff is the first wait after a failed list or watch, doubled up
	// to MaxBackoff, with jitter. Zero: 200 ms and 30 s.
	Backoff, MaxBackoff time.Duration
	// WatchTimeout is how long the API server keeps one watch open
	// (timeoutSeconds); the reflector then watches again from where it
	// was. Zero: 5 to 10 minutes, random, so that many agents do not
	// come back at once.
	WatchTimeout time.Duration
	// PageSize is the number of objects per list page. Zero: 500.
	PageSize int
}

func (o *ReflectorOptions[T]) validate() error {
	switch {
	case o.Client == nil:
		return errors.New("no API client")
	case o.Kind.Resource == "" || o.Kind.Version == "":
		return errors.New("no resource to watch")
	case o.Meta == nil:
		return errors.New("no metadata accessor")
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.LogEvery == 0 {
		o.LogEvery = 30 * time.Second
	}
	if o.Backoff == 0 {
		o.Backoff = 200 * time.Millisecond
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = 30 * time.Second
	}
	if o.PageSize == 0 {
		o.PageSize = 500
	}
	return nil
}

// Reflector keeps a cache of one collection in step with the API server:
// it lists (page by page), then watches from the list's resourceVersion,
// applying ADDED, MODIFIED and DELETED events and following BOOKMARKs. A
// watch that ends is resumed from the last resourceVersion seen; one the
// server no longer has (410 Gone, "too old resource version") makes it
// list again. While the API server cannot be reached the cache stays as
// it last was: a stale view beats none for a caller that must not open
// what its last view kept closed.
//
// It is client-go's reflector and informer cache cut to what the node
// agent needs, decoding into the caller's trimmed types.
type Reflector[T any] struct {
	o ReflectorOptions[T]

	mu sync.Mutex // guards the fields below
	// items is the cache; its objects are never changed once stored (an
	// event replaces them), so callers may keep them.
	items  map[string]*T
	rv     string // the resourceVersion to watch from; "" to list first
	synced bool
	err    error // the last failure, nil since the last success
	// synced is closed on the first complete list.
	syncedCh chan struct{}
	// retry cuts the wait after a failure short (Retry).
	retry chan struct{}

	// log rate limit: when the last line went out, how many were left out
	lastLog    time.Time
	suppressed int
}

// NewReflector checks o and returns a reflector that has not started.
func NewReflector[T any](o ReflectorOptions[T]) (*Reflector[T], error) {
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("watching %s: %w", o.Kind, err)
	}
	return &Reflector[T]{o: o, items: map[string]*T{}, syncedCh: make(chan struct{}), retry: make(chan struct{}, 1)}, nil
}

// Retry starts the next list or watch now when r is waiting after a
// failure. After an outage the wait can be MaxBackoff (30 s); a caller
// that needs the cache current right away (ADD waiting for its pod) should
// not wait for it once the API server answers again.
func (r *Reflector[T]) Retry() {
	select {
	case r.retry <- struct{}{}:
	default:
	}
}

// Kind is the collection r watches.
func (r *Reflector[T]) Kind() Kind { return r.o.Kind }

// HasSynced says whether a first list has completed: from then on the
// cache holds the whole collection (possibly stale while the API server
// is away).
func (r *Reflector[T]) HasSynced() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.synced
}

// Synced is closed once HasSynced is true.
func (r *Reflector[T]) Synced() <-chan struct{} { return r.syncedCh }

// Err is the last list or watch failure, nil once one succeeded since.
func (r *Reflector[T]) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Get returns the cached object under key ("namespace/name").
func (r *Reflector[T]) Get(key string) (*T, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	v, ok := r.items[key]
	return v, ok
}

// Len is the number of cached objects.
func (r *Reflector[T]) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.items)
}

// List returns a copy of the cache's map (the objects are shared: they
// are never modified).
func (r *Reflector[T]) List() map[string]*T {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]*T, len(r.items))
	for k, v := range r.items {
		out[k] = v
	}
	return out
}

// errGone marks a resourceVersion the API server no longer serves.
var errGone = errors.New("resource version expired (410 Gone)")

// Run lists and watches until ctx ends.
func (r *Reflector[T]) Run(ctx context.Context) {
	backoff := r.o.Backoff
	for ctx.Err() == nil {
		r.mu.Lock()
		rv := r.rv
		r.mu.Unlock()
		var err error
		progressed := false
		if rv == "" {
			err = r.list(ctx)
			progressed = err == nil
		}
		if err == nil {
			var events int
			start := time.Now()
			events, err = r.watch(ctx)
			// A watch the server ends at once, again and again, would
			// otherwise turn into a busy loop.
			progressed = progressed || events > 0 || time.Since(start) > time.Second
		}
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, errGone):
			r.mu.Lock()
			r.rv = ""
			r.mu.Unlock()
			r.o.Log.Info("watch expired: listing again", "resource", r.o.Kind.String())
			continue
		case err != nil:
			r.fail(err)
		case progressed:
			backoff = r.o.Backoff
			continue
		}
		// Jitter: between half and all of the backoff.
		wait := backoff/2 + rand.N(backoff/2+1)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		case <-r.retry:
		}
		backoff = min(2*backoff, r.o.MaxBackoff)
	}
}

// fail records err and logs it, rate-limited: an API server away for an
// hour must not fill the node's disk.
func (r *Reflector[T]) fail(err error) {
	r.mu.Lock()
	r.err = err
	now := time.Now()
	if !r.lastLog.IsZero() && now.Sub(r.lastLog) < r.o.LogEvery {
		r.suppressed++
		r.mu.Unlock()
		return
	}
	n, synced, size := r.suppressed, r.synced, len(r.items)
	r.lastLog, r.suppressed = now, 0
	r.mu.Unlock()
	msg := "cannot list or watch: keeping the last cache"
	if !synced {
		msg = "cannot list or watch: nothing cached yet"
	}
	r.o.Log.Warn(msg, "resource", r.o.Kind.String(), "err", err, "cached", size, "errorsNotLogged", n)
}

func (r *Reflector[T]) succeeded() {
	r.mu.Lock()
	had := r.err
	r.err = nil
	r.lastLog, r.suppressed = time.Time{}, 0
	r.mu.Unlock()
	if had != nil {
		r.o.Log.Info("API server reachable again", "resource", r.o.Kind.String())
	}
}

// maxPage caps one list page's body: 500 pods with long specs are a few
// MiB; this only stops a broken server from making us buffer without end.
const maxPage = 256 << 20

// list reads the whole collection, page by page, and replaces the cache.
func (r *Reflector[T]) list(ctx context.Context) error {
	items := map[string]*T{}
	cont, rv := "", ""
	for {
		q := url.Values{"limit": {strconv.Itoa(r.o.PageSize)}}
		if cont != "" {
			q.Set("continue", cont)
		}
		req := request{
			method: http.MethodGet, verb: "list", group: r.o.Kind.Group, resource: r.o.Kind.Resource,
			path: r.o.Kind.path() + "?" + q.Encode(),
		}
		var page struct {
			Metadata struct {
				ResourceVersion string `json:"resourceVersion"`
				Continue        string `json:"continue"`
			} `json:"metadata"`
			Items []T `json:"items"`
		}
		if err := r.get(ctx, req, &page); err != nil {
			return err
		}
		for i := range page.Items {
			it := &page.Items[i]
			items[r.o.Meta(it).Key()] = it
		}
		rv = page.Metadata.ResourceVersion
		if cont = page.Metadata.Continue; cont == "" {
			break
		}
	}
	if rv == "" {
		return fmt.Errorf("list %s: answer without metadata.resourceVersion", r.o.Kind)
	}
	r.mu.Lock()
	before := r.items
	r.items, r.rv = items, rv
	first := !r.synced
	r.synced = true
	r.mu.Unlock()
	if first {
		close(r.syncedCh)
	}
	r.succeeded()
	r.replaced(before, items)
	return nil
}

// replaced reports the difference a list made: the objects added, those
// whose ResourceVersion differs, and those gone. An object the list
// brings back unchanged is not reported: nothing about it changed.
func (r *Reflector[T]) replaced(before, after map[string]*T) {
	if r.o.OnChange == nil {
		return
	}
	for k, n := range after {
		o, ok := before[k]
		switch {
		case !ok:
			r.o.OnChange(nil, n)
		case r.o.Meta(o).ResourceVersion != r.o.Meta(n).ResourceVersion:
			r.o.OnChange(o, n)
		}
	}
	for k, o := range before {
		if _, ok := after[k]; !ok {
			r.o.OnChange(o, nil)
		}
	}
}

// get sends a list request and decodes its answer.
func (r *Reflector[T]) get(ctx context.Context, req request, out any) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	resp, err := r.o.Client.send(ctx, req, false)
	if err != nil {
		return err
	}
	defer drain(resp)
	if resp.StatusCode == http.StatusGone {
		return fmt.Errorf("%s: %w", req, errGone)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return apiErrorFrom(req, resp)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxPage)).Decode(out); err != nil {
		return fmt.Errorf("%s: decoding the answer: %w: %w", req, ErrUnreachable, err)
	}
	return nil
}

// watchEvent is one line of a watch stream.
type watchEvent struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
}

// watch follows the collection from r.rv until the server ends the watch
// (nil), the stream breaks, or the version expires (errGone). It returns
// how many events it applied.
func (r *Reflector[T]) watch(ctx context.Context) (int, error) {
	r.mu.Lock()
	rv := r.rv
	r.mu.Unlock()
	timeout := r.o.WatchTimeout
	if timeout == 0 {
		timeout = 5*time.Minute + rand.N(5*time.Minute)
	}
	q := url.Values{
		"watch":               {"1"},
		"allowWatchBookmarks": {"true"},
		"resourceVersion":     {rv},
		"timeoutSeconds":      {strconv.Itoa(max(1, int(timeout/time.Second)))},
	}
	req := request{
		method: http.MethodGet, verb: "watch", group: r.o.Kind.Group, resource: r.o.Kind.Resource,
		path: r.o.Kind.path() + "?" + q.Encode(),
	}
	// The server ends the watch after timeoutSeconds; a connection that
	// went silent (a server gone without a reset) ends here a little later.
	ctx, cancel := context.WithTimeout(ctx, timeout+30*time.Second)
	defer cancel()
	resp, err := r.o.Client.send(ctx, req, false)
	if err != nil {
		return 0, err
	}
	defer drain(resp)
	if resp.StatusCode == http.StatusGone {
		return 0, fmt.Errorf("%s: %w", req, errGone)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return 0, apiErrorFrom(req, resp)
	}
	r.succeeded()
	dec := json.NewDecoder(resp.Body)
	n := 0
	for {
		var ev watchEvent
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) {
				return n, nil
			}
			if ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
				// Our own bound on a silent stream: watch again.
				return n, nil
			}
			return n, fmt.Errorf("%s: reading the stream: %w: %w", req, ErrUnreachable, err)
		}
		if err := r.apply(ev); err != nil {
			return n, fmt.Errorf("%s: %w", req, err)
		}
		n++
	}
}

// apply applies one watch event to the cache.
func (r *Reflector[T]) apply(ev watchEvent) error {
	switch ev.Type {
	case "ADDED", "MODIFIED", "DELETED":
	case "BOOKMARK":
		var b struct {
			Metadata struct {
				ResourceVersion string `json:"resourceVersion"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(ev.Object, &b); err != nil {
			return fmt.Errorf("decoding a bookmark: %w", err)
		}
		if b.Metadata.ResourceVersion != "" {
			r.mu.Lock()
			r.rv = b.Metadata.ResourceVersion
			r.mu.Unlock()
		}
		return nil
	case "ERROR":
		var st struct {
			Code    int    `json:"code"`
			Reason  string `json:"reason"`
			Message string `json:"message"`
		}
		json.Unmarshal(ev.Object, &st)
		if st.Code == http.StatusGone || st.Reason == "Expired" || st.Reason == "Gone" {
			return fmt.Errorf("%s: %w", st.Message, errGone)
		}
		return fmt.Errorf("watch error %d %s: %s", st.Code, st.Reason, st.Message)
	default:
		return fmt.Errorf("watch event of unknown type %q", ev.Type)
	}
	obj := new(T)
	if err := json.Unmarshal(ev.Object, obj); err != nil {
		return fmt.Errorf("decoding a %s event: %w", ev.Type, err)
	}
	m := r.o.Meta(obj)
	r.mu.Lock()
	old, had := r.items[m.Key()]
	if ev.Type == "DELETED" {
		delete(r.items, m.Key())
	} else {
		r.items[m.Key()] = obj
	}
	if m.ResourceVersion != "" {
		r.rv = m.ResourceVersion
	}
	r.mu.Unlock()
	if r.o.OnChange == nil {
		return nil
	}
	switch {
	case ev.Type == "DELETED" && had:
		r.o.OnChange(old, nil)
	case ev.Type == "DELETED":
		// Deleted before this cache saw it: nothing changed here.
	case had:
		r.o.OnChange(old, obj)
	default:
		r.o.OnChange(nil, obj)
	}
	return nil
}
