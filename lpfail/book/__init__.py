"""What only the book uses: the figures (`plots`), the explorers and their kernel-free twins (`widgets`), the
verdict rules (`verdict`), the appendix's costs (`costs`) and chapter 1's analysis (`symptom_report`). They
read stored results; the core library and the experiments never import this package."""
