//go:build race

package nettest

// raceEnabled makes the binaries the tests run race-instrumented too, so
// that `go test -race` covers the stack process, not only the test.
const raceEnabled = true
