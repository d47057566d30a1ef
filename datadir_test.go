package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A lock file that cannot be opened is an error that names its path once.
func TestLockDataDirErrorNamesThePathOnce(t *testing.T) {
	dir := t.TempDir()
	lock := filepath.Join(dir, "playwatch.lock")
	if err := os.Mkdir(lock, 0o755); err != nil { // a directory cannot be opened for writing
		t.Fatal(err)
	}
	_, err := lockDataDir(dir)
	if err == nil {
		t.Fatal("lockDataDir succeeded on a directory")
	}
	if n := strings.Count(err.Error(), lock); n != 1 {
		t.Errorf("error %q names %s %d times, want once", err, lock, n)
	}
}
