//go:build race

package wirelink

// raceEnabled: the race detector allocates where the code does not, so
// allocation counts are not checked under it.
const raceEnabled = true
