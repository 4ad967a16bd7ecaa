package state

import (
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestLockExcludesAndTimesOut(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	l, err := s.Lock("c1", "eth0", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lock("c1", "eth0", 100*time.Millisecond); err == nil {
		t.Fatal("second Lock succeeded while the first is held")
	}
	other, err := s.Lock("c2", "eth0", 100*time.Millisecond)
	if err != nil {
		t.Fatalf("lock of another attachment: %v", err)
	}
	other.Unlock(true)
	l.Unlock(false)
	l2, err := s.Lock("c1", "eth0", 100*time.Millisecond)
	if err != nil {
		t.Fatalf("Lock after Unlock: %v", err)
	}
	l2.Unlock(true)
	if _, err := os.Stat(filepath.Join(s.Dir, "locks", Key("c1", "eth0")+".lock")); !os.IsNotExist(err) {
		t.Fatalf("Unlock(true) left the lock file: %v", err)
	}
}

// Holders that remove the lock file on Unlock must still exclude each
// other: a waiter that opened the old file must not win a lock on it.
func TestLockMutualExclusionWithRemove(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	var inside, maxInside atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 30; j++ {
				l, err := s.Lock("c", "eth0", 10*time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				n := inside.Add(1)
				if n > maxInside.Load() {
					maxInside.Store(n)
				}
				time.Sleep(100 * time.Microsecond)
				inside.Add(-1)
				l.Unlock(j%2 == 0)
			}
		}()
	}
	wg.Wait()
	if m := maxInside.Load(); m != 1 {
		t.Fatalf("%d holders at once", m)
	}
}
