//go:build !race

package wirelink

const raceEnabled = false
