//go:build !race

package nettest

const raceEnabled = false
