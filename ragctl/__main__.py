from ragctl.cli import main

raise SystemExit(main())
