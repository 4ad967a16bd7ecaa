package watch

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/cni-usernet/cni-usernet/pkg/agent/netpolicy"
	"github.com/cni-usernet/cni-usernet/test/lib/fakeapi"
)

// fakePods is the API server for the pods collection: in JSON without
// kinds (as a minimal server answers) or in protobuf (as the API server
// does).
type fakePods struct {
	t *testing.T
	*fakeapi.Server
}

func newFakePods(t *testing.T, proto bool) (*fakePods, *rest.Config) {
	o := fakeapi.Options{Token: "tok", NoKinds: !proto}
	if proto {
		o.Codec = protobufCodec(t)
	}
	f := &fakePods{t: t, Server: fakeapi.NewTest(t, o)}
	if proto {
		f.SetRaw(func(w http.ResponseWriter, r *http.Request) bool {
			if !strings.HasPrefix(r.Header.Get("Accept"), runtime.ContentTypeProtobuf) {
				t.Errorf("Accept %q: want protobuf first", r.Header.Get("Accept"))
			}
			return false
		})
	}
	return f, &rest.Config{Host: f.URL(), BearerToken: "tok", TLSClientConfig: rest.TLSClientConfig{CAData: f.CAPEM()}}
}

// protobufCodec encodes what the server sends in protobuf, through the
// types the watches decode.
func protobufCodec(t *testing.T) *fakeapi.Codec {
	info, _ := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	encode := func(doc []byte) ([]byte, error) {
		obj, _, err := codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			return nil, err
		}
		return runtime.Encode(codecs.EncoderForVersion(info.Serializer, corev1.SchemeGroupVersion), obj)
	}
	return &fakeapi.Codec{
		ContentType: runtime.ContentTypeProtobuf,
		Encode:      encode,
		Event: func(typ string, obj []byte) ([]byte, error) {
			raw, err := encode(obj)
			if err != nil {
				return nil, err
			}
			var b bytes.Buffer
			enc := streaming.NewEncoder(info.StreamSerializer.Framer.NewFrameWriter(&b), info.StreamSerializer.Serializer)
			err = enc.Encode(&metav1.WatchEvent{Type: typ, Object: runtime.RawExtension{Raw: raw}})
			return b.Bytes(), err
		},
	}
}

// setDown answers 503 without a body to everything, and ends the
// watches.
func (f *fakePods) setDown(down bool) {
	if down {
		f.SetFault("", &fakeapi.Fault{Code: http.StatusServiceUnavailable, Body: []byte{}})
	} else {
		f.SetFault("", nil)
	}
}

func (f *fakePods) put(p *corev1.Pod) {
	if _, err := f.Store.Put("pods", p.DeepCopy()); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakePods) del(key string) {
	ns, name, _ := strings.Cut(key, "/")
	if err := f.Store.Delete("pods", ns, name); err != nil {
		f.t.Fatal(err)
	}
}

// refusedCount is how many requests were answered 503 while down.
func (f *fakePods) refusedCount() int { return f.Refused() }

func (f *fakePods) listCount() int { return f.Count("list pods") }

// changes records OnChange's calls as "add ns/name", "update ns/name",
// "delete ns/name".
type changes struct {
	mu  sync.Mutex
	got []string
}

func (c *changes) record(old, new *netpolicy.Pod) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case old == nil:
		c.got = append(c.got, "add "+new.Metadata.Namespace+"/"+new.Metadata.Name)
	case new == nil:
		c.got = append(c.got, "delete "+old.Metadata.Namespace+"/"+old.Metadata.Name)
	default:
		c.got = append(c.got, "update "+new.Metadata.Namespace+"/"+new.Metadata.Name+" "+old.Metadata.Labels["v"]+">"+new.Metadata.Labels["v"])
	}
}

func (c *changes) has(s string) func() bool {
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, g := range c.got {
			if g == s {
				return true
			}
		}
		return false
	}
}

func (c *changes) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.got)
}

func runPods(t *testing.T, cfg *rest.Config, backoff time.Duration, logs *logBuf, ch *changes) *Informer[netpolicy.Pod] {
	t.Helper()
	log := slog.New(slog.NewTextHandler(logs, nil))
	i, err := New(Options[netpolicy.Pod]{Config: cfg, Kind: Pods, OnChange: ch.record, Log: log, Backoff: backoff, MaxBackoff: backoff})
	if err != nil {
		t.Fatal(err)
	}
	run(t, i)
	return i
}

// run runs i until the test ends.
func run[T any](t *testing.T, i *Informer[T]) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { i.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// logBuf is a log's lines, safe to read while the informer writes.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func testPod(name, v string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "ns", Name: name, UID: types.UID("uid-" + name), Labels: map[string]string{"v": v},
			Annotations:   map[string]string{"big": strings.Repeat("x", 1000)},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
		},
		Spec: corev1.PodSpec{
			NodeName: "node-1",
			Containers: []corev1.Container{{
				Name: "c", Image: "registry.example/app:1", Args: []string{"--serve"},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
			}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: "10.0.0.1"}}},
	}
}

// OnChange tells each add, update and delete, typed, with the old and
// the new object; in JSON without kinds and in protobuf.
func TestInformerOnChange(t *testing.T) {
	for _, proto := range []bool{false, true} {
		t.Run(map[bool]string{false: "json", true: "protobuf"}[proto], func(t *testing.T) {
			f, cfg := newFakePods(t, proto)
			f.put(testPod("a", "1"))
			ch := &changes{}
			i := runPods(t, cfg, 20*time.Millisecond, &logBuf{}, ch)
			eventually(t, "synced", i.HasSynced)
			<-i.Synced()
			eventually(t, "a listed", ch.has("add ns/a"))
			f.put(testPod("b", "1"))
			eventually(t, "b added", ch.has("add ns/b"))
			f.put(testPod("a", "2"))
			eventually(t, "a updated", ch.has("update ns/a 1>2"))
			f.del("ns/b")
			eventually(t, "b deleted", ch.has("delete ns/b"))
			if _, ok := i.Get("ns/b"); ok || i.Len() != 1 {
				t.Errorf("after the deletion: %d cached, b there: %v; want only a", i.Len(), ok)
			}
			if p, _ := i.Get("ns/a"); p == nil || p.Metadata.Labels["v"] != "2" {
				t.Errorf("a: got %+v, want the update", p)
			}
		})
	}
}

// The first list is told whole before the informer says it synced: a
// caller that keeps an index of its own from OnChange (the policy
// controller's peers) and starts compiling at Synced sees every object.
func TestInformerSyncedAfterTheFirstListIsTold(t *testing.T) {
	f, cfg := newFakePods(t, false)
	const n = 200
	for k := range n {
		f.put(testPod(fmt.Sprint("p", k), "1"))
	}
	var (
		mu          sync.Mutex
		told, after int
		i           *Informer[netpolicy.Pod]
	)
	ready := make(chan struct{})
	onChange := func(old, new *netpolicy.Pod) {
		<-ready
		mu.Lock()
		defer mu.Unlock()
		told++
		if i.HasSynced() {
			after++
		}
		time.Sleep(100 * time.Microsecond) // a slow listener widens the window
	}
	i, err := New(Options[netpolicy.Pod]{Config: cfg, Kind: Pods, OnChange: onChange, Log: slog.New(slog.DiscardHandler),
		Backoff: 20 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	close(ready)
	run(t, i)
	<-i.Synced()
	mu.Lock()
	defer mu.Unlock()
	if told != n || after != 0 {
		t.Errorf("at Synced %d of %d objects were told, %d of them after HasSynced", told, n, after)
	}
}

// What the cache keeps is the compiler's type: annotations, managed
// fields, images and arguments are gone; labels, ports by name, phase and
// addresses stay.
func TestInformerTransformTrims(t *testing.T) {
	f, cfg := newFakePods(t, false)
	f.put(testPod("a", "1"))
	i := runPods(t, cfg, 20*time.Millisecond, &logBuf{}, &changes{})
	eventually(t, "synced", i.HasSynced)
	p, _ := i.Get("ns/a")
	want := &netpolicy.Pod{
		Metadata: netpolicy.ObjectMeta{Namespace: "ns", Name: "a", UID: "uid-a", ResourceVersion: "1", Labels: map[string]string{"v": "1"}},
		Spec:     netpolicy.PodSpec{NodeName: "node-1", Containers: []netpolicy.Container{{Ports: []netpolicy.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: "TCP"}}}}},
		Status:   netpolicy.PodStatus{Phase: "Running", PodIPs: []netpolicy.PodIP{{IP: "10.0.0.1"}}},
	}
	got, _ := json.Marshal(p)
	wantJSON, _ := json.Marshal(want)
	if !bytes.Equal(got, wantJSON) {
		t.Errorf("cached:\n got %s\nwant %s", got, wantJSON)
	}
}

// A relist (the watch lost, the server back) tells what changed while the
// informer was not looking, and nothing for what did not.
func TestInformerRelistTellsTheDifference(t *testing.T) {
	f, cfg := newFakePods(t, false)
	f.put(testPod("a", "1"))
	f.put(testPod("b", "1"))
	f.put(testPod("c", "1"))
	ch := &changes{}
	logs := &logBuf{}
	i := runPods(t, cfg, 20*time.Millisecond, logs, ch)
	eventually(t, "synced", i.HasSynced)
	eventually(t, "three adds", func() bool { return ch.count() == 3 })

	f.setDown(true)
	eventually(t, "Err while the server is away", func() bool { return i.Err() != nil })
	if i.Len() != 3 {
		t.Errorf("while away: %d cached, want the last view's 3", i.Len())
	}
	// Changes the informer can only learn of by listing again: the
	// log a watch would resume from is compacted after them.
	f.Store.Compact()
	f.put(testPod("a", "2"))
	f.del("ns/b")
	f.put(testPod("d", "1"))
	f.Store.Compact()
	lists := f.listCount()
	f.setDown(false)
	eventually(t, "a relist", func() bool { return f.listCount() > lists })
	eventually(t, "the relist's changes", func() bool {
		return ch.has("update ns/a 1>2")() && ch.has("delete ns/b")() && ch.has("add ns/d")()
	})
	eventually(t, "Err cleared", func() bool { return i.Err() == nil })
	if n := ch.count(); n != 6 {
		t.Errorf("changes: got %d %v, want 6 (c unchanged is not told)", n, ch.got)
	}
	if !strings.Contains(logs.String(), "keeping the last cache") || !strings.Contains(logs.String(), "API server reachable again") {
		t.Errorf("log: want the outage and the recovery:\n%s", logs)
	}
}

// Err names the failure while the server cannot be reached at the
// start, and nothing is synced; the failures are logged once per
// LogEvery, on the informer's clock.
func TestInformerErrBeforeSync(t *testing.T) {
	f, cfg := newFakePods(t, false)
	f.setDown(true)
	logs := &logBuf{}
	clock := clocktesting.NewFakeClock(time.Now())
	log := slog.New(slog.NewTextHandler(logs, nil))
	i, err := New(Options[netpolicy.Pod]{Config: cfg, Kind: Pods, Log: log, Backoff: 20 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
		LogEvery: time.Minute, now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	run(t, i)

	eventually(t, "Err", func() bool { return i.Err() != nil })
	if i.HasSynced() {
		t.Error("synced without a list")
	}
	if !strings.Contains(i.Err().Error(), "pods") {
		t.Errorf("Err %q: want it to name the resource", i.Err())
	}
	refused := f.refusedCount()
	eventually(t, "more failed requests", func() bool { return f.refusedCount() >= refused+3 })
	if c := strings.Count(logs.String(), "nothing cached yet"); c != 1 {
		t.Errorf("log lines about the failures within LogEvery: got %d, want 1:\n%s", c, logs)
	}
	clock.Step(time.Minute)
	eventually(t, "a second line once LogEvery passed", func() bool { return strings.Count(logs.String(), "nothing cached yet") == 2 })
	var lines []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "nothing cached yet") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 2 || strings.Contains(lines[1], "errorsNotLogged=0") {
		t.Errorf("the second line does not count the failures left out:\n%s", logs)
	}
	f.setDown(false)
	eventually(t, "synced once back", i.HasSynced)
	eventually(t, "Err cleared", func() bool { return i.Err() == nil })
}

// Retry starts the next list at once when a long backoff would otherwise
// keep the cache stale after the server came back.
func TestInformerRetryCutsTheBackoff(t *testing.T) {
	f, cfg := newFakePods(t, false)
	f.setDown(true)
	i := runPods(t, cfg, time.Minute, &logBuf{}, &changes{})
	eventually(t, "Err", func() bool { return i.Err() != nil })
	f.put(testPod("a", "1"))
	f.setDown(false)
	time.Sleep(200 * time.Millisecond)
	if i.HasSynced() {
		t.Fatal("synced within the backoff: the test does not test Retry")
	}
	start := time.Now()
	i.Retry()
	eventually(t, "synced after Retry", i.HasSynced)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Retry took %s", d)
	}
	if _, ok := i.Get("ns/a"); !ok {
		t.Error("a not cached after Retry")
	}
	// While the watch works, Retry lists nothing again.
	lists := f.listCount()
	i.Retry()
	time.Sleep(200 * time.Millisecond)
	if n := f.listCount(); n != lists {
		t.Errorf("Retry while healthy: %d lists, want %d", n, lists)
	}
}

// A kind the agent does not keep as T is refused at New.
func TestNewRefusesAMismatch(t *testing.T) {
	_, err := New(Options[netpolicy.Service]{Config: &rest.Config{Host: "https://127.0.0.1"}, Kind: Pods})
	if err == nil || !strings.Contains(err.Error(), "pods") {
		t.Errorf("pods as Services: got %v, want a refusal naming pods", err)
	}
}

// A server that answers the namespaces' metadata-only list with whole
// Namespaces (a NamespaceList, as the test stand-ins and some proxies
// do) still fills the cache by the first list: the informer is synced
// with every namespace and its labels, not with none until the watch
// brings them.
func TestInformerNamespacesFromAWholeList(t *testing.T) {
	f := fakeapi.NewTest(t, fakeapi.Options{Token: "tok"})
	for _, ns := range []string{"a", "b", "c"} {
		if _, err := f.Store.Put("namespaces", &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"team": ns}}}); err != nil {
			t.Fatal(err)
		}
	}
	cfg := &rest.Config{Host: f.URL(), BearerToken: "tok", TLSClientConfig: rest.TLSClientConfig{CAData: f.CAPEM()}}
	var mu sync.Mutex
	var told int
	i, err := New(Options[netpolicy.Namespace]{Config: cfg, Kind: Namespaces, Log: slog.New(slog.DiscardHandler),
		OnChange: func(old, new *netpolicy.Namespace) { mu.Lock(); told++; mu.Unlock() },
		Backoff:  20 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	run(t, i)
	<-i.Synced()
	mu.Lock()
	defer mu.Unlock()
	if told != 3 || len(i.List()) != 3 {
		t.Fatalf("at Synced %d namespaces told, %d cached, want 3", told, len(i.List()))
	}
	if ns, ok := i.Get("b"); !ok || ns.Metadata.Labels["team"] != "b" {
		t.Errorf("namespace b cached as %+v", ns)
	}
}
