package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/vishvananda/netlink"
)

// inSandboxEnv marks the harness re-executed in its own namespaces.
const inSandboxEnv = "POLICYSCALE_SANDBOX"

// reexecInSandbox runs this program again in a new network namespace
// (only its loopback: the fake API server's traffic never leaves the
// machine, and the agent sees no node address of the host) and a new
// mount namespace (for the service account files the agent's in-cluster
// configuration reads), and returns its exit code. ok false: already
// inside.
func reexecInSandbox() (code int, ok bool) {
	if os.Getenv(inSandboxEnv) != "" {
		return 0, false
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "policyscale:", err)
		return 1, true
	}
	c := exec.Command(exe, os.Args[1:]...)
	c.Stdin, c.Stdout, c.Stderr = os.Stdin, os.Stdout, os.Stderr
	c.Env = append(os.Environ(), inSandboxEnv+"=1")
	c.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET | syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	if err := c.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode(), true
		}
		fmt.Fprintln(os.Stderr, "policyscale: re-executing in new namespaces (needs root):", err)
		return 1, true
	}
	return 0, true
}

// setupSandbox, inside the new namespaces: loopback up, mounts private
// (nothing done here reaches the host's mount table).
func setupSandbox() error {
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making the mounts private: %w", err)
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("finding loopback: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("setting loopback up: %w", err)
	}
	return nil
}

// serviceAccountDir is where the agent reads its in-cluster credentials.
const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// mountServiceAccount bind-mounts src (token, ca.crt, namespace) on the
// service account directory, in the harness's mount namespace, which the
// agent inherits. Where that directory does not exist, a tmpfs goes over
// its deepest existing parent first (in this namespace only; the host's
// files are neither changed nor seen by the agent there).
func mountServiceAccount(src string) error {
	target, err := resolveExisting(serviceAccountDir)
	if err != nil {
		return err
	}
	if _, err := os.Stat(target); errors.Is(err, fs.ErrNotExist) {
		parent := filepath.Dir(target)
		for {
			if _, err := os.Stat(parent); err == nil {
				break
			}
			parent = filepath.Dir(parent)
		}
		if err := syscall.Mount("tmpfs", parent, "tmpfs", 0, "mode=0755,size=1m"); err != nil {
			return fmt.Errorf("mounting a tmpfs on %s for the service account: %w", parent, err)
		}
		if err := os.MkdirAll(target, 0o755); err != nil {
			return err
		}
	}
	if err := syscall.Mount(src, target, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mounting the service account on %s: %w", target, err)
	}
	return nil
}

// resolveExisting follows the symlinks of p's existing leading part
// (/var/run is /run on most systems).
func resolveExisting(p string) (string, error) {
	rest := ""
	for q := p; ; q = filepath.Dir(q) {
		if r, err := filepath.EvalSymlinks(q); err == nil {
			return filepath.Join(r, rest), nil
		}
		if q == "/" {
			return "", fmt.Errorf("resolving %s", p)
		}
		rest = filepath.Join(filepath.Base(q), rest)
	}
}
