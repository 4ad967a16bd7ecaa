package agentapi

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

func TestAppendDrain(t *testing.T) {
	dir := t.TempDir()
	if recs, bad, err := Drain(dir); err != nil || len(recs) != 0 || bad != 0 {
		t.Fatalf("drain of no log: got %v, %d, %v; want nothing", recs, bad, err)
	}
	want := []Record{
		{"ADD", ResultSuccess, 123456 * time.Microsecond},
		{"DEL", ResultError, 2 * time.Millisecond},
		{"CHECK", ResultTryAgainLater, 0},
	}
	for _, r := range want {
		if err := Append(dir, r); err != nil {
			t.Fatal(err)
		}
	}
	// A torn line, as a crash mid-write would leave.
	f, _ := os.OpenFile(filepath.Join(dir, FileName), os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString("ADD succ\n")
	f.Close()
	got, bad, err := Drain(dir)
	if err != nil {
		t.Fatal(err)
	}
	if bad != 1 {
		t.Errorf("bad lines: got %d, want 1", bad)
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("record %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
	if got, _, _ := Drain(dir); len(got) != 0 {
		t.Errorf("second drain: got %v, want nothing (the first empties the log)", got)
	}
}

// Concurrent appends and drains lose and tear nothing.
func TestConcurrent(t *testing.T) {
	dir := t.TempDir()
	const writers, each = 8, 200
	var wg sync.WaitGroup
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if err := Append(dir, Record{"ADD", ResultSuccess, time.Millisecond}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	done := make(chan struct{})
	total := 0
	go func() {
		defer close(done)
		for total < writers*each {
			recs, bad, err := Drain(dir)
			if err != nil || bad != 0 {
				t.Errorf("drain: %d bad lines, %v", bad, err)
				return
			}
			total += len(recs)
		}
	}()
	wg.Wait()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("drained %d records, want %d", total, writers*each)
	}
	if total != writers*each {
		t.Errorf("drained %d records, want %d", total, writers*each)
	}
}

func TestFull(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, FileName), make([]byte, MaxSize), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Append(dir, Record{"ADD", ResultSuccess, time.Millisecond}); err != ErrFull {
		t.Fatalf("append to a full log: got %v, want ErrFull", err)
	}
	st, _ := os.Stat(filepath.Join(dir, FileName))
	if st.Size() != MaxSize {
		t.Errorf("size: got %d, want %d", st.Size(), MaxSize)
	}
}

// What a verb pays for its record (the agent drains meanwhile, as it
// would every 10 s).
func BenchmarkAppend(b *testing.B) {
	dir := b.TempDir()
	r := Record{"ADD", ResultSuccess, 80 * time.Millisecond}
	for i := 0; b.Loop(); i++ {
		if err := Append(dir, r); err != nil {
			b.Fatal(err)
		}
		if i%1000 == 999 {
			Drain(dir)
		}
	}
}
