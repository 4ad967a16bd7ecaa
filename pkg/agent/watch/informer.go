// Package watch keeps the node agent's caches of the cluster's objects
// in step with the API server: client-go's reflector lists and watches,
// and each object is trimmed to the type the policy compiler reads once,
// as it arrives.
package watch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// Options configure an Informer.
type Options[T any] struct {
	// Config reaches the API server. Required.
	Config *rest.Config
	// Kind is the collection, listed and watched in all namespaces: one
	// of the five the policy controller watches (Pods, ...), whose
	// objects the cache keeps as T (netpolicy.Pod, ...). Required.
	Kind Kind
	// OnChange is called, outside any lock, after each change of the
	// cache: old nil for an object added, new nil for one deleted. A
	// list that replaces the cache calls it for each object it adds,
	// changes (another resourceVersion) or removes. It must not block.
	// Nil: no call.
	OnChange func(old, new *T)
	// Log receives the failures, at most one line per LogEvery (with the
	// count of those left out). Nil: slog.Default.
	Log *slog.Logger
	// LogEvery bounds the error lines. Zero: 30 s.
	LogEvery time.Duration
	// Backoff is the first wait after a failed list or watch, doubled up
	// to MaxBackoff, with jitter. Zero: client-go's, 800 ms and 30 s.
	Backoff, MaxBackoff time.Duration
	// now is the clock LogEvery is measured on, for tests; nil:
	// time.Now.
	now func() time.Time
}

func (o *Options[T]) validate() error {
	switch {
	case o.Config == nil:
		return errors.New("no API client configuration")
	case o.Kind.Resource == "":
		return errors.New("no resource to watch")
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.now == nil {
		o.now = time.Now
	}
	if o.LogEvery == 0 {
		o.LogEvery = 30 * time.Second
	}
	if o.Backoff == 0 {
		o.Backoff = 800 * time.Millisecond
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = 30 * time.Second
	}
	return nil
}

// Informer is one collection's cache, kept by client-go's reflector. It
// gives its callers a reflector's surface (Run, Retry, HasSynced, Synced,
// Err, Get, Len, List), over the trimmed types.
//
// It is an informer without the informer's queue and indexer: the
// reflector writes into the typed map directly. A shared informer would
// keep the API objects in its indexer beside the converted ones, and
// keeps its reflector's backoff out of reach, which Retry needs.
//
// While the API server cannot be reached the cache stays as it last
// was: a stale view beats none for a caller that must not open what its
// last view kept closed.
type Informer[T any] struct {
	o   Options[T]
	src *source[T]

	mu sync.Mutex // guards the fields below
	// items is the cache; its objects are never changed once stored (an
	// event replaces them), so callers may keep them.
	items  map[string]*T
	synced bool
	err    error // the last failure, nil since the last success
	// log rate limit: when the last line went out, how many were left out
	lastLog    time.Time
	suppressed int

	// absent: the collection is optional and its resource was not
	// served at the last list.
	absent bool

	// syncedCh is closed on the first complete list.
	syncedCh chan struct{}
	// retry asks Run to start the reflector again (Retry).
	retry chan struct{}
}

// New checks o and returns an informer that has not started.
func New[T any](o Options[T]) (*Informer[T], error) {
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("watching %s: %w", o.Kind, err)
	}
	c, ok := collections[o.Kind].(*collection[T])
	if !ok {
		var t T
		return nil, fmt.Errorf("watching %s: not a collection the agent keeps as %T", o.Kind, t)
	}
	rc, err := restClient(o.Config, c.kindGV(), c.item)
	if err != nil {
		return nil, fmt.Errorf("watching %s: %w", o.Kind, err)
	}
	i := &Informer[T]{o: o, items: map[string]*T{}, syncedCh: make(chan struct{}), retry: make(chan struct{}, 1)}
	i.src = &source[T]{c: c, rc: rc, report: i.report, absent: i.noteAbsent}
	return i, nil
}

// Kind is the collection i watches.
func (i *Informer[T]) Kind() Kind { return i.o.Kind }

// HasSynced says whether a first list has completed: from then on the
// cache holds the whole collection (possibly stale while the API server
// is away).
func (i *Informer[T]) HasSynced() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.synced
}

// Synced is closed once HasSynced is true.
func (i *Informer[T]) Synced() <-chan struct{} { return i.syncedCh }

// Err is the last list or watch failure, nil once one succeeded since.
func (i *Informer[T]) Err() error {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.err
}

// Get returns the cached object under key ("namespace/name").
func (i *Informer[T]) Get(key string) (*T, bool) {
	i.mu.Lock()
	defer i.mu.Unlock()
	v, ok := i.items[key]
	return v, ok
}

// Len is the number of cached objects.
func (i *Informer[T]) Len() int {
	i.mu.Lock()
	defer i.mu.Unlock()
	return len(i.items)
}

// List returns a copy of the cache's map (the objects are shared: they
// are never modified).
func (i *Informer[T]) List() map[string]*T {
	i.mu.Lock()
	defer i.mu.Unlock()
	out := make(map[string]*T, len(i.items))
	for k, v := range i.items {
		out[k] = v
	}
	return out
}

// Retry lists and watches again now when the last attempt failed: after
// an outage the reflector's wait can be MaxBackoff (30 s), and a caller
// that needs the cache current right away (ADD waiting for its pod)
// should not wait for it once the API server answers again. client-go's
// reflector has no way to cut its wait short, so Run starts a new one
// on the same cache; while the watches work, Retry does nothing.
func (i *Informer[T]) Retry() {
	select {
	case i.retry <- struct{}{}:
	default:
	}
}

// Run lists and watches until ctx ends.
func (i *Informer[T]) Run(ctx context.Context) {
	// client-go logs through klog; what the agent should see of the
	// failures, Informer logs itself (report), rate-limited.
	ctx = klog.NewContext(ctx, logr.Discard())
	quiet := logr.Discard()
	backoff := &wait.Backoff{
		Duration: i.o.Backoff, Cap: i.o.MaxBackoff, Factor: 2, Jitter: 0.5,
		Steps: int(math.Ceil(float64(i.o.MaxBackoff) / float64(i.o.Backoff))),
	}
	for {
		rctx, cancel := context.WithCancel(ctx)
		r := cache.NewReflectorWithOptions(i.src, &entry[T]{}, (*store[T])(i), cache.ReflectorOptions{
			Name: i.o.Kind.String(), Logger: &quiet, Backoff: backoff,
		})
		done := make(chan struct{})
		go func() { defer close(done); r.RunWithContext(rctx) }()
		for restart := false; !restart; {
			select {
			case <-ctx.Done():
				cancel()
				<-done
				return
			case <-i.retry:
				// While the watches work there is nothing to cut short.
				restart = i.Err() != nil
			}
		}
		cancel()
		<-done
	}
}

// report records the outcome of a list or watch request; failures are
// logged at most once per LogEvery, since an API server away for an hour
// must not fill the node's disk.
func (i *Informer[T]) report(err error) {
	i.mu.Lock()
	if err == nil {
		had := i.err
		i.err = nil
		i.lastLog, i.suppressed = time.Time{}, 0
		i.mu.Unlock()
		if had != nil {
			i.o.Log.Info("API server reachable again", "resource", i.o.Kind.String())
		}
		return
	}
	i.err = err
	now := i.o.now()
	if !i.lastLog.IsZero() && now.Sub(i.lastLog) < i.o.LogEvery {
		i.suppressed++
		i.mu.Unlock()
		return
	}
	n, synced, size := i.suppressed, i.synced, len(i.items)
	i.lastLog, i.suppressed = now, 0
	i.mu.Unlock()
	msg := "cannot list or watch: keeping the last cache"
	if !synced {
		msg = "cannot list or watch: nothing cached yet"
	}
	i.o.Log.Warn(msg, "resource", i.o.Kind.String(), "err", err, "cached", size, "errorsNotLogged", n)
}

// Absent says whether the collection is an optional one (a CRD's) that
// the API server did not serve at the last list: the cache is then empty
// and the collection synced.
func (i *Informer[T]) Absent() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.absent
}

// noteAbsent records whether an optional collection's resource is served
// (the list's answer was not 404) and says so once at each change; for a
// 404 it returns whether the list counts as empty. It does not while the
// cache holds objects: an API server that restarts may answer 404 for a
// custom resource until it has loaded the CRD, and forgetting policies
// for that moment would open what they close. The cache then stays as it
// was, as when the server is away.
func (i *Informer[T]) noteAbsent(absent bool) (empty bool) {
	i.mu.Lock()
	if absent && len(i.items) > 0 {
		i.mu.Unlock()
		return false
	}
	was := i.absent
	i.absent = absent
	i.mu.Unlock()
	switch {
	case absent && !was:
		i.o.Log.Warn("the API server does not serve this resource (its CRD is not installed): taken as none, looked for again at every relist",
			"resource", i.o.Kind.String())
	case !absent && was:
		i.o.Log.Info("the API server serves this resource now", "resource", i.o.Kind.String())
	}
	return absent
}
