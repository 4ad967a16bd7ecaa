package sandbox

import (
	"os"
	"testing"
)

// BenchmarkProgram is what building the filter costs each stack start.
func BenchmarkProgram(b *testing.B) {
	for b.Loop() {
		if _, err := program(On, os.Getpid()); err != nil {
			b.Fatal(err)
		}
	}
}
