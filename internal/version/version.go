// Package version holds build information stamped by the linker:
//
//	-ldflags "-X github.com/pgwake/pgwake/internal/version.Version=v1.2.3"
package version

import "runtime/debug"

// Stamped at build time; the defaults describe a development build.
var (
	Version = "dev"
	Commit  = "none"
	Date    = "unknown"
)

// String is the one-line version shown by `pgwake version`.
func String() string {
	v, c := Version, Commit
	if c == "none" {
		if bi, ok := debug.ReadBuildInfo(); ok {
			for _, s := range bi.Settings {
				if s.Key == "vcs.revision" && len(s.Value) >= 12 {
					c = s.Value[:12]
				}
			}
		}
	}
	return "pgwake " + v + " (commit " + c + ", built " + Date + ")"
}
