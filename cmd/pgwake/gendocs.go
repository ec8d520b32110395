package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// newGenDocsCommand writes man pages and shell completions for packaging
// (goreleaser runs it before building archives). Hidden: not for users.
func newGenDocsCommand(d *deps) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:    "gen-docs",
		Short:  "Write man pages and shell completions (for packaging)",
		Hidden: true,
		Args:   exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			root := cmd.Root()
			man := filepath.Join(out, "manpages")
			comp := filepath.Join(out, "completions")
			for _, dir := range []string{man, comp} {
				if err := os.MkdirAll(dir, 0o755); err != nil {
					return err
				}
			}
			root.DisableAutoGenTag = true // reproducible output: no date in the pages
			if err := doc.GenManTree(root, &doc.GenManHeader{Title: "PGWAKE", Section: "1", Source: "pgwake"}, man); err != nil {
				return fmt.Errorf("man pages: %w", err)
			}
			gens := map[string]func(string) error{
				"pgwake.bash": func(p string) error { return root.GenBashCompletionFileV2(p, true) },
				"pgwake.zsh":  root.GenZshCompletionFile,
				"pgwake.fish": func(p string) error { return root.GenFishCompletionFile(p, true) },
			}
			for name, gen := range gens {
				if err := gen(filepath.Join(comp, name)); err != nil {
					return fmt.Errorf("completion %s: %w", name, err)
				}
			}
			fmt.Fprintf(d.stderr, "wrote %s and %s\n", man, comp)
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "docs/generated", "output directory")
	return cmd
}
