/** The panel's icon: a chip with pins, themed like JupyterLab's own icons (the `jp-icon3` fill). */
import { LabIcon } from '@jupyterlab/ui-components';

import gpuSvg from '../style/gpu.svg';

export const gpuIcon = new LabIcon({ name: 'gpu-notebook:gpu', svgstr: gpuSvg });
