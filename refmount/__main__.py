from refmount.cli import main

raise SystemExit(main())
