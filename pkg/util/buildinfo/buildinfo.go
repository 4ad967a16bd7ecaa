// Package buildinfo is the one place the build stamps: the Makefile and
// the release scripts set Version with -ldflags -X, one path for all
// three binaries (cni-usernet, cni-usernet-agent, cni-usernet-stack).
// A package of its own, small as it is, so that one -X path stamps every
// binary and a binary links nothing else to learn its version; not
// "version", which the plugin imports from libcni beside it.
package buildinfo

// Version is the version the binary was built as; the build sets it
// with -ldflags "-X github.com/cni-usernet/cni-usernet/pkg/util/buildinfo.Version=v1.2.3".
// "dev": a build without the stamp (go build, go test).
var Version = "dev"

// String is how binary names its version, in `version` and in the
// plugin's CNI VERSION answer: "cni-usernet v1.2.3".
func String(binary string) string { return binary + " " + Version }
