package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
)

func main() {
	pkgs, err := list("./cmd/...", "./pkg/...")
	if err != nil {
		fmt.Fprintln(os.Stderr, "imports:", err)
		os.Exit(2)
	}
	bad := Violations(pkgs)
	for _, v := range bad {
		fmt.Fprintln(os.Stderr, v)
	}
	if len(bad) > 0 {
		os.Exit(1)
	}
	fmt.Printf("imports: %d packages keep the rule between processes\n", len(pkgs))
}

// list runs go list over patterns: each package with what it links.
func list(patterns ...string) ([]Package, error) {
	cmd := exec.Command("go", append([]string{"list", "-json=ImportPath,Deps"}, patterns...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("listing packages: %w: %s", err, stderr.Bytes())
	}
	var pkgs []Package
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p Package
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			return nil, fmt.Errorf("decoding go list's output: %w", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) == 0 {
		return nil, fmt.Errorf("go list found no packages")
	}
	return pkgs, nil
}
