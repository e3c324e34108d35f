"""Exit 0 when every `name==version` pin of the given requirement files (-r FILE ...) is installed
in this Python at that version, 1 otherwise: scripts/setup.sh runs pip only then."""
import importlib.metadata
import re
import sys


def pins(paths):
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.split("#", 1)[0].strip()
                if line:
                    name, _, version = line.partition("==")
                    yield name.strip(), version.strip()


def main():
    paths = [a for a in sys.argv[1:] if a != "-r"]
    for name, version in pins(paths):
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return 1
        if re.sub(r"\+.*", "", installed) != version:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
