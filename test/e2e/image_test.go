package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// podImage is the test pods' image: Debian's static busybox (wget, nslookup,
// ip, sh) and podtool (the servers), built here and imported into
// containerd; nothing is pulled.
//
// Its tag is set by buildPodImage from the podtool binary's hash: node 2's
// import skips a tag it already has, so a changed podtool needs a new tag.
var podImage = "localhost/cni-usernet-e2e/podtool:dev"

func buildPodImage(t *testing.T, repo string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	work := t.TempDir()
	root := filepath.Join(work, "rootfs")
	for _, d := range []string{"bin", "etc", "tmp", "proc", "sys", "dev", "root"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(root, 0o755)
	os.Chmod(filepath.Join(root, "tmp"), 0o1777)
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		t.Fatalf("the pod image needs a static busybox (Debian: busybox-static): %v", err)
	}
	if out, err := run(ctx, "", "cp", busybox, filepath.Join(root, "bin", "busybox")); err != nil {
		t.Fatal(out, err)
	}
	list, err := run(ctx, "", busybox, "--list")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range strings.Fields(list) {
		if a != "busybox" {
			os.Symlink("busybox", filepath.Join(root, "bin", a))
		}
	}
	os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(root, "etc", "group"), []byte("root:x:0:\n"), 0o644)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", filepath.Join(root, "podtool"), "./test/e2e/podtool")
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building podtool: %v\n%s", err, out)
	}
	bin, err := os.ReadFile(filepath.Join(root, "podtool"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(bin)
	podImage = "localhost/cni-usernet-e2e/podtool:" + hex.EncodeToString(sum[:6])
	tar := filepath.Join(work, "podtool.tar")
	if _, err := run(ctx, repo, "hack/k8s/images/mkimage.sh", podImage, root, tar, `["/podtool"]`, `["serve"]`); err != nil {
		t.Fatal(err)
	}
	if _, err := run(ctx, "", "ctr", "-n", "k8s.io", "images", "import", tar); err != nil {
		t.Fatal(err)
	}
	if node2() != "" {
		if _, err := run(ctx, repo, "hack/k8s/node2.sh", "import", tar); err != nil {
			t.Fatal(err)
		}
	}
}
