package install

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"

	"github.com/cni-usernet/cni-usernet/pkg/util/atomicfile"
)

// fileMeta is what we keep of a file besides its bytes: enough to put it
// back exactly as it was.
type fileMeta struct {
	Mode fs.FileMode `json:"mode"`
	UID  int         `json:"uid"`
	GID  int         `json:"gid"`
}

func metaOf(fi fs.FileInfo) fileMeta {
	m := fileMeta{Mode: fi.Mode().Perm() | fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky), UID: -1, GID: -1}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		m.UID, m.GID = int(st.Uid), int(st.Gid)
	}
	return m
}

// readFile returns the file's bytes and metadata, or ok=false when there is
// no file at path.
//
// A symbolic link is an error: replacing it would turn it into a file, and
// writing through it would change a file elsewhere that we cannot restore
// under the same name.
func readFile(path string) (data []byte, meta fileMeta, ok bool, err error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		return nil, fileMeta{}, false, fmt.Errorf("%s is a symbolic link: cni-usernet does not edit through links", path)
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fileMeta{}, false, nil
	}
	if err != nil {
		return nil, fileMeta{}, false, fmt.Errorf("opening %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fileMeta{}, false, fmt.Errorf("examining %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fileMeta{}, false, fmt.Errorf("%s is not a regular file (%s)", path, fi.Mode().Type())
	}
	data, err = io.ReadAll(f)
	if err != nil {
		return nil, fileMeta{}, false, fmt.Errorf("reading %s: %w", path, err)
	}
	return data, metaOf(fi), true, nil
}

func sum(data []byte) string {
	h := sha256.Sum256(data)
	return hex.EncodeToString(h[:])
}

// writeAtomic replaces path with the bytes from r, with meta's mode and
// owner (a negative UID or GID leaves the owner to the process), durable
// before it returns.
func writeAtomic(path string, r io.Reader, meta fileMeta) error {
	return atomicfile.WriteFrom(path, r, atomicfile.Meta(meta))
}

// removeFile removes path (already gone is fine), durably.
func removeFile(path string) error {
	return atomicfile.Remove(path)
}
