// Compiles the precompiled header once for every Loom target.
