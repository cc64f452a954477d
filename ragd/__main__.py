from ragd.daemon import main

raise SystemExit(main())
