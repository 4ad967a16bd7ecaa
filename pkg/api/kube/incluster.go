package kube

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// ServiceAccountDir is where kubelet mounts a pod's service account
// token, CA bundle and namespace.
const ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// Files inside ServiceAccountDir.
const (
	tokenFileName     = "token"
	caFileName        = "ca.crt"
	namespaceFileName = "namespace"
)

// InCluster builds a client from the pod's service account, for the node
// agent. The token file is re-read whenever kubelet rotates it.
func InCluster() (*Client, error) {
	cfg, err := InClusterConfig()
	if err != nil {
		return nil, err
	}
	return New(cfg)
}

// InClusterConfig is the Config InCluster uses, for a caller that wants to
// change something first (the agent may point at another server address;
// see docs/kube.md).
func InClusterConfig() (Config, error) {
	return inClusterConfig(ServiceAccountDir, os.Getenv)
}

func inClusterConfig(dir string, getenv func(string) string) (Config, error) {
	host, port := getenv("KUBERNETES_SERVICE_HOST"), getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return Config{}, errors.New("not running in a pod: KUBERNETES_SERVICE_HOST or KUBERNETES_SERVICE_PORT is not set")
	}
	ca, err := os.ReadFile(filepath.Join(dir, caFileName))
	if err != nil {
		return Config{}, fmt.Errorf("reading the service account CA: %w", err)
	}
	return Config{
		// JoinHostPort brackets an IPv6 service address.
		Server:    "https://" + net.JoinHostPort(host, port),
		CAPEM:     ca,
		TokenFile: filepath.Join(dir, tokenFileName),
	}, nil
}

// InClusterNamespace returns the namespace the agent's pod runs in.
func InClusterNamespace() (string, error) {
	b, err := os.ReadFile(filepath.Join(ServiceAccountDir, namespaceFileName))
	if err != nil {
		return "", fmt.Errorf("reading the pod's namespace: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// tokenSource supplies the bearer token for each request.
type tokenSource interface {
	// get returns the current token; fresh forces a re-read.
	get(fresh bool) (string, error)
	// refresh re-reads the token and says whether it changed.
	refresh() (tok string, changed bool, err error)
}

type staticToken string

func (t staticToken) get(bool) (string, error)       { return string(t), nil }
func (t staticToken) refresh() (string, bool, error) { return string(t), false, nil }

// fileToken re-reads a token file when its metadata changes. kubelet
// replaces projected tokens by swapping a symlink to a new file, which
// changes the inode and modification time that Stat (following the link)
// reports; a stat per request is far cheaper than the request itself.
type fileToken struct {
	path string

	mu    sync.Mutex // guards token and info
	token string
	info  os.FileInfo // of the file token was read from
}

func (f *fileToken) get(fresh bool) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.getLocked(fresh)
}

func (f *fileToken) refresh() (string, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	old := f.token
	tok, err := f.getLocked(true)
	return tok, err == nil && tok != old, err
}

func (f *fileToken) getLocked(fresh bool) (string, error) {
	fi, err := os.Stat(f.path)
	if err != nil {
		return "", fmt.Errorf("reading the token file: %w", err)
	}
	if !fresh && f.info != nil && os.SameFile(f.info, fi) &&
		fi.ModTime().Equal(f.info.ModTime()) && fi.Size() == f.info.Size() {
		return f.token, nil
	}
	b, err := os.ReadFile(f.path)
	if err != nil {
		return "", fmt.Errorf("reading the token file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("token file %s is empty", f.path)
	}
	f.token, f.info = tok, fi
	return tok, nil
}
