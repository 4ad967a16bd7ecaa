package launch

import (
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestAliveZombie: a killed process nobody has reaped yet (what a stack
// becomes where PID 1 does not reap orphans) is not alive, nor is a
// process whose start time differs from the recorded one (PID reuse).
func TestAliveZombie(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	reaped := false
	t.Cleanup(func() {
		if !reaped {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	pid := cmd.Process.Pid
	st, err := StartTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	p := Process{PID: pid, StartTime: st}
	if !Alive(p) {
		t.Fatalf("Alive(%+v) of a running process: got false, want true", p)
	}
	if Alive(Process{PID: pid, StartTime: st + 1}) {
		t.Errorf("Alive with another start time: got true, want false")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Not waited for: the process stays a zombie until cmd.Wait.
	for deadline := time.Now().Add(5 * time.Second); ; {
		state, _, err := procStat(pid)
		if err != nil {
			t.Fatalf("reading /proc/%d/stat: %v", pid, err)
		}
		if state == 'Z' {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d in state %c 5 s after SIGKILL, want Z", pid, state)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if Alive(p) {
		t.Errorf("Alive(%+v) of a zombie: got true, want false", p)
	}
	cmd.Wait()
	reaped = true
	if Alive(p) {
		t.Errorf("Alive(%+v) after reaping: got true, want false", p)
	}
}
