// Tool module: flannel's CNI plugin for the lab's chained-mode test, built by
// hack/k8s/lib/build.sh. Its module (github.com/flannel-io/cni-plugin) is
// refused by the module proxy; containernetworking/plugins v0.9.1 is the last
// release that still carries it (plugins/meta/flannel), hence a module of its
// own, apart from the repository's current plugins.
module k8s-lab/flannel-cni

go 1.24.0

require github.com/containernetworking/plugins v0.9.1

require (
	github.com/Microsoft/go-winio v0.4.11 // indirect
	github.com/Microsoft/hcsshim v0.8.6 // indirect
	github.com/buger/jsonparser v0.0.0-20180808090653-f4dd9f5a6b44 // indirect
	github.com/containernetworking/cni v0.8.1 // indirect
	github.com/sirupsen/logrus v1.0.6 // indirect
	golang.org/x/crypto v0.0.0-20200622213623-75b288015ac9 // indirect
	golang.org/x/sys v0.0.0-20201117170446-d9b008d0a637 // indirect
)
