package main

import (
	"fmt"
	"regexp"
)

// packageNamePattern is Android's rule for application ids: at least two
// segments, each starting with a letter, then letters, digits or underscores.
var packageNamePattern = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_]*(\.[A-Za-z][A-Za-z0-9_]*)+$`)

// maxPackageNameLen is the width of the package_name column; the pattern
// allows ASCII only, so bytes and characters are the same count.
const maxPackageNameLen = 255

func validatePackageName(pkg string) error {
	if len(pkg) > maxPackageNameLen {
		return fmt.Errorf("package_name is longer than %d characters", maxPackageNameLen)
	}
	if !packageNamePattern.MatchString(pkg) {
		return fmt.Errorf("package_name %q is not an Android package name (segments of letters, digits and _, each starting with a letter, at least two, separated by dots)", pkg)
	}
	return nil
}
