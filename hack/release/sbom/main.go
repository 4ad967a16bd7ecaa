// Command sbom writes an SPDX 2.3 JSON software bill of materials for
// cni-usernet's release binaries from what the Go toolchain recorded in
// them (debug/buildinfo): the main module, every module linked, and the
// gVisor replacement with the patches the build applies. No network and
// no tool beyond Go: what the binaries say they hold is what it lists.
//
//	go run ./hack/release/sbom -version v0.1.0 -out sbom.spdx.json bin/cni-usernet bin/cni-usernet-stack
package main

import (
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

type checksum struct {
	Algorithm string `json:"algorithm"`
	Value     string `json:"checksumValue"`
}

type externalRef struct {
	Category string `json:"referenceCategory"`
	Type     string `json:"referenceType"`
	Locator  string `json:"referenceLocator"`
}

type spdxPackage struct {
	ID               string        `json:"SPDXID"`
	Name             string        `json:"name"`
	Version          string        `json:"versionInfo,omitempty"`
	Download         string        `json:"downloadLocation"`
	FilesAnalyzed    bool          `json:"filesAnalyzed"`
	LicenseConcluded string        `json:"licenseConcluded"`
	LicenseDeclared  string        `json:"licenseDeclared"`
	Copyright        string        `json:"copyrightText"`
	Comment          string        `json:"comment,omitempty"`
	Checksums        []checksum    `json:"checksums,omitempty"`
	ExternalRefs     []externalRef `json:"externalRefs,omitempty"`
}

type relationship struct {
	From string `json:"spdxElementId"`
	Type string `json:"relationshipType"`
	To   string `json:"relatedSpdxElement"`
}

type document struct {
	SPDXVersion  string `json:"spdxVersion"`
	DataLicense  string `json:"dataLicense"`
	ID           string `json:"SPDXID"`
	Name         string `json:"name"`
	Namespace    string `json:"documentNamespace"`
	CreationInfo struct {
		Created  string   `json:"created"`
		Creators []string `json:"creators"`
	} `json:"creationInfo"`
	Packages      []spdxPackage  `json:"packages"`
	Relationships []relationship `json:"relationships"`
}

func main() {
	version := flag.String("version", "dev", "the release's version")
	out := flag.String("out", "-", "where to write the SBOM (- for stdout)")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: sbom [-version V] [-out FILE] BINARY...")
		os.Exit(2)
	}
	doc, err := build(*version, flag.Args(), time.Now().UTC())
	if err != nil {
		fmt.Fprintln(os.Stderr, "sbom:", err)
		os.Exit(1)
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		fmt.Fprintln(os.Stderr, "sbom: encoding:", err)
		os.Exit(1)
	}
	b = append(b, '\n')
	if *out == "-" {
		_, err = os.Stdout.Write(b)
	} else {
		err = os.WriteFile(*out, b, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sbom: writing:", err)
		os.Exit(1)
	}
}

// spdxID makes an SPDX identifier from a name: letters, digits, '.', '-'.
func spdxID(kind, name string) string {
	var b strings.Builder
	for _, r := range name {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	return "SPDXRef-" + kind + "-" + b.String()
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func build(version string, binaries []string, now time.Time) (*document, error) {
	doc := &document{SPDXVersion: "SPDX-2.3", DataLicense: "CC0-1.0", ID: "SPDXRef-DOCUMENT",
		Name:      "cni-usernet-" + version,
		Namespace: "https://github.com/cni-usernet/cni-usernet/releases/" + version + "/sbom"}
	doc.CreationInfo.Created = now.Format(time.RFC3339)
	doc.CreationInfo.Creators = []string{"Tool: cni-usernet hack/release/sbom"}
	modules := map[string]spdxPackage{}
	for _, bin := range binaries {
		info, err := buildinfo.ReadFile(bin)
		if err != nil {
			return nil, fmt.Errorf("reading the build information of %s: %w", bin, err)
		}
		sum, err := fileSHA256(bin)
		if err != nil {
			return nil, fmt.Errorf("hashing %s: %w", bin, err)
		}
		name := filepath.Base(bin)
		binID := spdxID("File", name)
		doc.Packages = append(doc.Packages, spdxPackage{ID: binID, Name: name, Version: version,
			Download: "NOASSERTION", LicenseConcluded: "Apache-2.0", LicenseDeclared: "Apache-2.0",
			Copyright: "NOASSERTION", Comment: "built with " + info.GoVersion + " from " + info.Main.Path,
			Checksums: []checksum{{"SHA256", sum}}})
		doc.Relationships = append(doc.Relationships, relationship{"SPDXRef-DOCUMENT", "DESCRIBES", binID})
		for _, m := range info.Deps {
			p := spdxPackage{Name: m.Path, Version: m.Version, Download: "NOASSERTION",
				LicenseConcluded: "NOASSERTION", LicenseDeclared: "NOASSERTION", Copyright: "NOASSERTION"}
			if m.Replace != nil {
				p.Comment = "replaced by " + m.Replace.Path
				if m.Replace.Version != "" {
					p.Version = m.Replace.Version
				}
				if m.Path == "gvisor.dev/gvisor" {
					p.Comment = "patched by the build: hack/gvisor/patches (docs/gvisor-patches.md), Apache-2.0"
					p.LicenseDeclared = "Apache-2.0"
				}
			}
			if p.Version != "" {
				p.ExternalRefs = []externalRef{{"PACKAGE-MANAGER", "purl", "pkg:golang/" + m.Path + "@" + p.Version}}
			}
			p.ID = spdxID("Package", m.Path+"-"+p.Version)
			modules[p.ID] = p
			doc.Relationships = append(doc.Relationships, relationship{binID, "CONTAINS", p.ID})
		}
	}
	ids := make([]string, 0, len(modules))
	for id := range modules {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		doc.Packages = append(doc.Packages, modules[id])
	}
	return doc, nil
}
