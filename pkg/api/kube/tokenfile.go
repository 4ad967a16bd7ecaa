package kube

import (
	"fmt"
	"os"
	"strings"
	"sync"
)

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
